"""Batch limits per engine and device: the sweep behind settings.BATCH_LIMITS and the ov:
engine's scheduler defaults (OV_MAX_BATCHED_TOKENS).

In-process, no stack: the engine as a worker loads it, the benchmark's 128 arithmetic
questions (bench/harness/data.arithmetic_rows, the against_lmeval set) rendered as the worker
renders them, cut by the worker's own plan (worker/batching.plan_batches) under each token
budget. Swept:

* hf (transformers, static batches): BATCH_TOKEN_BUDGET over 2,048 (the seed's GPU figure,
  18-25 items a batch here) to 32,768 (every item in one batch), BATCH_MAX_ITEMS 512;
* ov (OpenVINO GenAI continuous batching): its scheduler's tokens per step
  (OV_MAX_BATCHED_TOKENS), with every item in one engine call, and the seed's 2,048-token
  worker budget at the best step size (what splitting the calls costs a continuous batcher).

Each point is timed `--repeats` times (median), the points' order rotating between repeats
so that outside load falls on all of them alike; the machine's load average is recorded.
Output: bench/results/batch_sweep.json, best setting per engine.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import data, inprocess, recording

NAME = "batch_sweep"
HF_BUDGETS = (2048, 4096, 8192, 16384, 32768)
OV_STEP_TOKENS = (128, 256, 512, 1024)
ALL_IN_ONE = (1 << 20, 4096)  # a budget and an item cap no 128-item set reaches


def _plan(prepared: inprocess.Prepared, budget: int, items: int) -> list[list[int]]:
    from evalstream.worker.batching import plan_batches

    return plan_batches(
        prepared.prompt_tokens, token_budget=budget, max_items=items, max_new_tokens=prepared.max_new
    )


def _time(engine: Any, prepared: inprocess.Prepared, plan: list[list[int]]) -> dict[str, Any]:
    load = os.getloadavg()[0]
    run = inprocess.run_engine(engine, prepared, plan)
    return {
        "seconds": round(run.seconds, 3),
        "items_per_s": round(run.items_per_s, 3),
        "batches": [len(b) for b in plan],
        "tokens_out": run.completion_tokens,
        "loadavg_1m": round(load, 2),
        "texts": [getattr(o, "text", None) for o in run.outputs],
    }


def _median(points: list[dict[str, Any]]) -> dict[str, Any]:
    runs = sorted(points, key=lambda p: p["seconds"])
    mid = runs[len(runs) // 2]
    return {
        "seconds_median": mid["seconds"],
        "items_per_s_median": round(statistics.median(p["items_per_s"] for p in points), 3),
        "seconds_all": [p["seconds"] for p in points],
        "loadavg_1m": [p["loadavg_1m"] for p in points],
        "batches": mid["batches"],
        "tokens_out": mid["tokens_out"],
    }


def sweep_hf(
    rows: list[dict[str, Any]], max_tokens: int, repeats: int, budgets: tuple[int, ...]
) -> dict[str, Any]:
    engine = inprocess.load_engine("hf:smollm2-135m-instruct")
    prepared = inprocess.prepare(engine, rows, max_tokens)
    engine.generate(prepared.requests[:2])  # warm-up
    points: dict[int, list[dict[str, Any]]] = {b: [] for b in budgets}
    for r in range(repeats):
        order = list(budgets[r % len(budgets) :] + budgets[: r % len(budgets)])
        for budget in order:
            res = _time(engine, prepared, _plan(prepared, budget, 512))
            recording.log(f"hf budget {budget}: {res['items_per_s']} items/s, batches {res['batches']}")
            points[budget].append(res)
    texts = {b: p[0]["texts"] for b, p in points.items()}
    engine.close()
    out = {str(b): _median(p) for b, p in points.items()}
    best = max(out, key=lambda b: out[b]["items_per_s_median"])
    first = texts[budgets[0]]
    return {
        "points": out,
        "best_token_budget": int(best),
        "answers_same_across_budgets": all(t == first for t in texts.values()),
    }


def _fresh(rows: list[dict[str, Any]], step: int, run: int) -> list[dict[str, Any]]:
    """Questions no earlier run of this engine has seen, as many as `rows`."""
    return data.arithmetic_rows(len(rows), seed=10_000 + step * 100 + run)


def sweep_ov(
    rows: list[dict[str, Any]], max_tokens: int, repeats: int, steps: tuple[int, ...]
) -> dict[str, Any]:
    from evalstream.common.settings import Settings

    out: dict[str, Any] = {}
    texts: dict[str, list[Any]] = {}
    base = Settings.from_env()
    # the configured default step size also runs under the seed's 2,048-token worker budget
    split_at = base.ov_max_batched_tokens if base.ov_max_batched_tokens in steps else steps[0]
    for step in steps:
        settings = Settings.from_env({**os.environ, "OV_MAX_BATCHED_TOKENS": str(step)})
        from evalstream.worker.engines import load_engine

        engine = load_engine("ov:smollm2-135m-instruct", settings)
        prepared = inprocess.prepare(engine, rows, max_tokens)
        engine.generate(prepared.requests[:2])  # warm-up
        runs = []
        for r in range(repeats):
            # OpenVINO's prefix cache keeps every prompt it has seen: a repeat on the same
            # questions would skip their prefill, so each timed run after the first gets
            # questions of its own (same generator, shape and length)
            fresh = prepared if r == 0 else inprocess.prepare(engine, _fresh(rows, step, r), max_tokens)
            runs.append(_time(engine, fresh, _plan(fresh, *ALL_IN_ONE)))
            recording.log(f"ov step tokens {step}: {runs[-1]['items_per_s']} items/s")
        texts[f"step{step}"] = runs[0]["texts"]
        out[f"step{step}"] = _median(runs)
        if step == split_at:
            split = []
            for r in range(repeats):
                fresh = inprocess.prepare(engine, _fresh(rows, step, repeats + r), max_tokens)
                split.append(_time(engine, fresh, _plan(fresh, 2048, 64)))
            out[f"step{step}_worker_budget_2048"] = _median(split)
            recording.log(f"ov step {step}, worker budget 2048: {out[f'step{step}_worker_budget_2048']}")
        engine.close()
    best = max(
        (k for k in out if k.startswith("step") and "_" not in k), key=lambda k: out[k]["items_per_s_median"]
    )
    first = next(iter(texts.values()))
    return {
        "points": out,
        "best_step_tokens": int(best.removeprefix("step")),
        "answers_same_across_steps": all(t == first for t in texts.values()),
    }


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    started = time.monotonic()
    n, max_tokens = (128, 32) if not args.quick else (16, 8)
    repeats = 1 if args.quick else args.repeats
    rows = data.arithmetic_rows(n, seed=2)
    hf = sweep_hf(rows, max_tokens, repeats, HF_BUDGETS if not args.quick else (2048, 32768))
    ov = sweep_ov(rows, max_tokens, repeats, OV_STEP_TOKENS if not args.quick else (256,))
    hf_best = hf["points"][str(hf["best_token_budget"])]["items_per_s_median"]
    ov_best = ov["points"][f"step{ov['best_step_tokens']}"]["items_per_s_median"]
    recording.write_result(
        NAME,
        {
            "params": {"questions": n, "max_tokens": max_tokens, "repeats": repeats},
            "hf_cpu": hf,
            "ov_cpu": ov,
            "ov_over_hf_best": round(ov_best / hf_best, 3) if hf_best else None,
            "goals": [],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
