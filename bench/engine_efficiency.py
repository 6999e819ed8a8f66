"""1. Engine efficiency: the pipeline end to end versus the same engine called directly.

Pipeline: `evalctl submit` (in-process) -> producer -> router -> worker -> aggregator, clock
stopped when every result is in PostgreSQL, on the default model (hf:smollm2-135m-instruct),
answer cache emptied first. Direct: the same HFEngine (same cached safetensors, same torch
threads) in this process, on the same questions rendered the same way, same generation
settings, cut by the worker's batching plan (plan_batches with BATCH_TOKEN_BUDGET and
BATCH_MAX_ITEMS). Headline: pipeline items/s ÷ direct items/s, per repeat (the two arms
alternate which goes first), median over the repeats whose two arms saw the same outside
load (other work on the shared machine, from /proc/stat less this benchmark's own
processes, within 0.25 cores; all repeats if fewer than two qualify). Goal ≥ 0.90.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    benchstack,
    data,
    inprocess,
    interference,
    paths,
    pipeline_runs,
    profiled,
    pure,
    recording,
)

NAME = "engine_efficiency"
GOAL = 0.90


def explain(ratio: float | None, reps: list[dict[str, Any]]) -> str:
    busy = pure.summarize([x["pipeline_engine_busy_ratio"] for x in reps])["median"] or 0.0
    submit = pure.summarize([x["pipeline"]["submit_s"] for x in reps])["median"] or 0.0
    elapsed = pure.summarize([x["pipeline"]["elapsed_s"] for x in reps])["median"] or 0.0
    batches = pure.summarize([x["pipeline_engine"]["batches"] for x in reps])["median"] or 0.0
    direct = len(reps[0]["direct"]["batches"]) if reps else 0
    # engine seconds inside the worker against the same plan run in this process
    inflation = pure.summarize(
        [
            x["pipeline_engine"]["engine_busy_s"] / x["direct"]["seconds"]
            for x in reps
            if x["direct"]["seconds"]
        ]
    )["median"]
    text = (
        f"engine efficiency {ratio or 0:.2f}: in the pipeline the worker's engine was busy {busy:.0%} of the "
        f"{elapsed:.1f} s from submit to the last result (submit itself {submit:.2f} s), in {batches:.0f} engine "
        f"batches where the direct plan has {direct}. "
    )
    if inflation and inflation > 1.02:
        text += (
            f"The engine calls themselves took {inflation:.2f}× as long in the worker as the same plan in this "
            "process: the worker's torch runs two threads on the machine's two cores beside Kafka, PostgreSQL, "
            "the router, the aggregator and its own event loop, and a two-thread matmul stalls whenever either "
            "core is taken. On a GPU worker the device does the work and this share would vanish; on CPUs, "
            "leaving a core to the rest of the stack (fewer torch threads) or a host of its own for the worker "
            "would close it."
        )
    else:
        text += (
            "The rest is the path around the engine (producer, router, the worker's batch wait, publishing, "
            "the aggregator's writes); overlapping the next round's preparation with the current batch would "
            "close it."
        )
    return text


def main() -> None:
    args = recording.arg_parser(__doc__).parse_args()
    started = time.monotonic()
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    n, repeats, max_tokens = (16, 1, 16) if args.quick else (48, 5, 32)
    rows = data.arithmetic_rows(n, seed=1)
    gen = ["--max-tokens", str(max_tokens), "--grader", "exact"]

    recording.log("loading the engine in-process")
    engine = inprocess.load_engine()
    prepared = inprocess.prepare(engine, rows, max_tokens)
    plan = inprocess.default_plan(prepared)
    engine.generate(prepared.requests[:2])  # warm-up (first-call allocations), untimed
    recording.log(f"{n} items, max_tokens {max_tokens}, direct plan {[len(b) for b in plan]}")

    repeats_out: list[dict[str, Any]] = []
    budget = profiled.Budget(200, 3)
    for r in budget.range(repeats):
        inprocess.clear_answer_cache()

        foreign: dict[str, float] = {}

        def direct(foreign: dict[str, float] = foreign) -> inprocess.EngineRun:
            other = interference.Interference()
            run = inprocess.run_engine(engine, prepared, plan)
            foreign["direct"] = other.cores()
            return run

        def pipeline(
            r: int = r, foreign: dict[str, float] = foreign
        ) -> tuple[pipeline_runs.PipelineRun, dict[str, float]]:
            before = inprocess.engine_calls()
            other = interference.Interference()
            run = pipeline_runs.run_pipeline(rows, *gen, name=f"bench-engine-{r}")
            foreign["pipeline"] = other.cores()
            return run, inprocess.delta(inprocess.engine_calls(), before)

        if r % 2 == 0:
            d = direct()
            p, calls = pipeline()
        else:
            p, calls = pipeline()
            d = direct()
        same = inprocess.same_answers(prepared, d.outputs, inprocess.responses(p.run_id))
        ratio = p.items_per_s / d.items_per_s
        busy = calls["engine_busy_s"] / p.elapsed_s if p.elapsed_s else 0.0
        recording.log(
            f"repeat {r}: pipeline {p.items_per_s:.3f} items/s ({p.elapsed_s:.1f} s, {calls['batches']:.0f} batches, "
            f"engine busy {busy:.0%}), direct {d.items_per_s:.3f} items/s ({d.seconds:.1f} s) -> ratio {ratio:.3f}; "
            f"other work on the machine: {foreign['pipeline']:.2f} / {foreign['direct']:.2f} cores"
        )
        if p.cache_hits or p.failed:
            recording.log(f"warning: {p.cache_hits} cache hits, {p.failed} failures in {p.run_id}")
        repeats_out.append(
            {
                "pipeline": p.as_dict(),
                "pipeline_engine": calls,
                "pipeline_engine_busy_ratio": round(busy, 3),
                "direct": {
                    "items": d.items,
                    "seconds": round(d.seconds, 3),
                    "items_per_s": round(d.items_per_s, 3),
                    "batches": [len(b) for b in d.batches],
                    "completion_tokens": d.completion_tokens,
                },
                "same_answers": round(same, 3),
                "other_load_cores": {"pipeline": foreign["pipeline"], "direct": foreign["direct"]},
                "ratio": round(ratio, 4),
            }
        )
    ratio_s = interference.headline(
        [x["ratio"] for x in repeats_out],
        [(x["other_load_cores"]["pipeline"], x["other_load_cores"]["direct"]) for x in repeats_out],
    )
    med = ratio_s["median"]
    recording.write_result(
        NAME,
        {
            "time_allowance": budget.as_dict(),
            "params": {
                "items": n,
                "repeats": repeats,
                "max_tokens": max_tokens,
                "grader": "exact",
                "model": paths.DEFAULT_MODEL,
                "device": engine.device,
                "direct_plan": [len(b) for b in plan],
            },
            "repeats": repeats_out,
            "ratio": ratio_s,
            "pipeline_items_per_s": pure.summarize([x["pipeline"]["items_per_s"] for x in repeats_out]),
            "direct_items_per_s": pure.summarize([x["direct"]["items_per_s"] for x in repeats_out]),
            "diagnosis": [] if med is not None and med >= GOAL else [explain(med, repeats_out)],
            "goals": [
                pure.goal_row(
                    "1",
                    "engine efficiency (pipeline ÷ direct engine, items/s)",
                    f"≥ {GOAL:.2f}",
                    interference.headline_text(ratio_s),
                    med is not None and med >= GOAL,
                    f"{n} items, max_tokens {max_tokens}, default model on CPU; "
                    f"pipeline {pure.fmt_num(pure.summarize([x['pipeline']['items_per_s'] for x in repeats_out])['median'])} items/s",
                )
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
