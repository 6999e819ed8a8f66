"""6. Dynamic batching versus fixed batch sizes, on a set of mixed prompt and answer lengths.

In-process: the worker's HFEngine (default model) and its batching plan, without Kafka
(the pipeline adds nothing to what is compared here). The set mixes short questions,
questions about passages of a few dozen to a few hundred tokens, and requests for
explanations and lists (answers from a few tokens to the max_tokens limit), shuffled, as
they would arrive. Policies: the worker's default plan (sort by prompt length, cut under
BATCH_TOKEN_BUDGET and BATCH_MAX_ITEMS) versus fixed batches of 1, 8 and 32 in arrival
order. Reported per policy: items/s, prompt padding ratio (padded share of all prompt
positions), decode waste (row-steps spent on rows already finished), and whether the
answers equal batch size 1's. The policies' order rotates between repeats; headline:
default items/s ÷ the best fixed size's, median of repeats.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import benchstack, inprocess, profiled, pure, recording

NAME = "batching"
FIXED = (1, 8, 32)

_PLACES = ["Aldford", "Brennick", "Carrow", "Dunmere", "Elsworth", "Fenwick", "Glenhollow", "Harrowgate"]
_PEOPLE = ["Mara", "Tobias", "Ilse", "Dorian", "Wen", "Priya", "Oskar", "Lena"]
_SENTENCES = [
    "In {year}, the town of {place} built {n} stone bridges across its river.",
    "{person} kept the town records and counted {n} new families that spring.",
    "The market of {place} opened every {day}, selling wool, salt and dried fish.",
    "A flood in {year} destroyed {n} houses near the old mill.",
    "{person} was elected mayor after promising to repair the harbour wall.",
    "Travellers said the road from {place} to the coast took {n} days on foot.",
    "The school of {place} taught {n} children to read and to keep accounts.",
    "Every autumn the fishermen of {place} held a race of {n} boats.",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_EXPLAIN = [
    "Explain why the sky looks blue during the day.",
    "Explain how a bicycle stays upright while moving.",
    "Explain why bread rises when it is baked.",
    "Explain what causes the seasons on Earth.",
]
_LISTS = ["fruits", "musical instruments", "European capitals", "kinds of trees", "programming languages"]


def mixed_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            a, b = rnd.randint(10, 99), rnd.randint(2, 9)
            q = f"What is {a} + {b}? Answer with the number only."
        elif kind == 1:
            sentences = [
                rnd.choice(_SENTENCES).format(
                    year=rnd.randint(1700, 1950),
                    place=rnd.choice(_PLACES),
                    person=rnd.choice(_PEOPLE),
                    n=rnd.randint(2, 40),
                    day=rnd.choice(_DAYS),
                )
                for _ in range(rnd.choice((3, 6, 12, 24)))
            ]
            q = (
                " ".join(sentences)
                + "\n\nQuestion: which town is mentioned first? Answer with its name only."
            )
        elif kind == 2:
            q = rnd.choice(_EXPLAIN)
        else:
            q = f"List {rnd.randint(3, 8)} {rnd.choice(_LISTS)}, one per line."
        rows.append({"id": f"m{i:04d}", "question": q, "answer": ""})
    rnd.shuffle(rows)
    return rows


def main() -> None:
    args = recording.arg_parser(__doc__).parse_args()
    started = time.monotonic()
    benchstack.use_bench_stack()  # for the settings' MODEL_CACHE_DIR and batch defaults only
    n, max_tokens, repeats = (8, 16, 1) if args.quick else (24, 40, 3)
    rows = mixed_rows(n, seed=6)
    engine = inprocess.load_engine()
    prepared = inprocess.prepare(engine, rows, max_tokens, grader="exact", prompt_template="{question}")
    engine.generate(prepared.requests[:2])  # warm-up, untimed
    policies: dict[str, list[list[int]]] = {"default": inprocess.default_plan(prepared)}
    for k in FIXED:
        policies[f"fixed-{k}"] = pure.fixed_batches(n, k)
    lengths = prepared.prompt_tokens
    recording.log(
        f"{n} items, prompt tokens {min(lengths)}–{max(lengths)}, max_tokens {max_tokens}; "
        f"default plan {[len(b) for b in policies['default']]}"
    )
    names = list(policies)
    per: dict[str, list[dict[str, Any]]] = {p: [] for p in names}
    budget = profiled.Budget(240, 1)
    for r in budget.range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for p in order:
            run = inprocess.run_engine(engine, prepared, policies[p])
            completions = [getattr(o, "completion_tokens", 0) for o in run.outputs]
            slots = sum(len(b) * max(completions[i] for i in b) for b in run.batches)
            per[p].append(
                {
                    "items_per_s": run.items_per_s,
                    "seconds": run.seconds,
                    "decode_waste": 1 - sum(completions) / slots if slots else 0.0,
                    "texts": [getattr(o, "text", None) for o in run.outputs],
                    "completion_tokens": sum(completions),
                }
            )
            recording.log(f"repeat {r} {p}: {run.items_per_s:.3f} items/s ({run.seconds:.1f} s)")
    reference = per["fixed-1"][0]["texts"]
    out: dict[str, Any] = {}
    for p in names:
        pad = pure.padding_stats([[lengths[i] for i in b] for b in policies[p]])
        out[p] = {
            "batches": [len(b) for b in policies[p]],
            "items_per_s": pure.summarize([x["items_per_s"] for x in per[p]]),
            "padding_ratio": round(pad["padding_ratio"], 4),
            "mean_batch_padding_ratio": round(pad["mean_batch_padding_ratio"], 4),
            "decode_waste": round(sum(x["decode_waste"] for x in per[p]) / len(per[p]), 4),
            "completion_tokens": per[p][0]["completion_tokens"],
            "same_answers_as_batch_1": round(
                sum(a == b for a, b in zip(per[p][0]["texts"], reference, strict=True)) / n, 3
            ),
        }
    vs: dict[str, Any] = {}
    for k in FIXED:
        vs[f"fixed-{k}"] = pure.summarize(
            pure.ratios(
                [x["items_per_s"] for x in per["default"]], [x["items_per_s"] for x in per[f"fixed-{k}"]]
            )
        )
    best_fixed = max(FIXED, key=lambda k: out[f"fixed-{k}"]["items_per_s"]["median"] or 0)
    vs_best = vs[f"fixed-{best_fixed}"]
    med = vs_best["median"]
    table = "; ".join(
        f"{p}: {pure.fmt_num(out[p]['items_per_s']['median'])} items/s, padding {out[p]['padding_ratio']:.0%}"
        for p in names
    )
    recording.write_result(
        NAME,
        {
            "time_allowance": budget.as_dict(),
            "params": {
                "items": n,
                "max_tokens": max_tokens,
                "repeats": repeats,
                "prompt_tokens": {
                    "min": min(lengths),
                    "max": max(lengths),
                    "mean": round(sum(lengths) / n, 1),
                },
                "in_process": True,
            },
            "policies": out,
            "default_over_fixed": vs,
            "best_fixed": best_fixed,
            "goals": [
                pure.goal_row(
                    "6",
                    "dynamic batching (default ÷ best fixed batch size, items/s; in-process engine + plan)",
                    "≥ 1",
                    f"{pure.fmt_num(med)} vs fixed-{best_fixed} (median of {vs_best['n']}); "
                    + ", ".join(f"vs fixed-{k} {pure.fmt_num(vs[f'fixed-{k}']['median'])}" for k in FIXED),
                    med is not None and med >= 1.0,
                    table,
                )
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
