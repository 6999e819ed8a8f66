"""The timed arms the comparisons against lm-eval share: the pipeline as a user runs it
(`evalctl submit --wait`, `evalctl compare`), the pipeline submitted in this process, and the
engine called directly. Each arm records the load average and the cores other programs kept
busy while it ran (bench/harness/interference.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from bench.harness import data, inprocess, interference, paths, pipeline_runs


def timed_submit(*args: str) -> tuple[float, dict[str, Any]]:
    """`evalctl submit ARGS --wait --json` from start to exit: (seconds, the run's summary)."""
    argv = [str(paths.ROOT / ".venv" / "bin" / "evalctl"), "submit", *args, "--wait", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=os.environ)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"evalctl submit exited with {proc.returncode}: {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def evalctl_submit_wait(rows: list[dict[str, Any]], spec: str, max_tokens: int, name: str) -> dict[str, Any]:
    """`evalctl submit --wait` as a user runs it, from start to exit (interpreter start,
    validation, upload, the whole run, its report); the answer cache emptied first."""
    path = data.write_jsonl(data.data_dir() / f"{name}.jsonl", rows)
    inprocess.clear_answer_cache()
    before = inprocess.engine_calls()
    other = interference.Interference()
    load = os.getloadavg()[0]
    seconds, summary = timed_submit(
        str(path), "--model", spec, "--max-tokens", str(max_tokens), "--grader", "exact", "--name", name
    )
    path.unlink(missing_ok=True)
    calls = inprocess.delta(inprocess.engine_calls(), before)
    return {
        "spec": spec,
        "run_id": summary["run_id"],
        "items": len(rows),
        "seconds": round(seconds, 3),
        "items_per_s": round(len(rows) / seconds, 3),
        "failed": summary.get("failed"),
        "cache_hits": summary.get("cache_hits"),
        "accuracy": summary.get("accuracy"),
        "engine_busy_s": calls["engine_busy_s"],
        "engine_batches": calls["batches"],
        "loadavg_1m": round(load, 2),
        "other_load_cores": other.cores(),
    }


def evalctl_compare(run_a: str, run_b: str) -> dict[str, Any]:
    """`evalctl compare A B --json`: identical answers, accuracy delta, McNemar."""
    proc = subprocess.run(
        [str(paths.ROOT / ".venv" / "bin" / "evalctl"), "compare", run_a, run_b, "--json"],
        capture_output=True,
        text=True,
        env=os.environ,
        check=True,
    )
    c = json.loads(proc.stdout.strip().splitlines()[-1])
    common = c["items"]["common"]
    return {
        "runs": [run_a, run_b],
        "items": common,
        "identical_answers": c["identical_responses"],
        "identical_share": round(c["identical_responses"] / common, 4) if common else None,
        "accuracy": c["accuracy"],
        "mcnemar": c["mcnemar"],
    }


def direct_engine(engine: Any, rows: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The engine called directly, in this process, with the worker's batching plan."""
    prepared = inprocess.prepare(engine, rows, max_tokens)
    plan = inprocess.default_plan(prepared, engine)
    other = interference.Interference()
    load = os.getloadavg()[0]
    run = inprocess.run_engine(engine, prepared, plan)
    return {
        "spec": engine.name,
        "items": run.items,
        "seconds": round(run.seconds, 3),
        "items_per_s": round(run.items_per_s, 3),
        "batches": [len(b) for b in plan],
        "tokens_out": run.completion_tokens,
        "loadavg_1m": round(load, 2),
        "other_load_cores": other.cores(),
        "responses": {r["id"]: getattr(o, "text", None) for r, o in zip(rows, run.outputs, strict=True)},
    }


def pipeline_in_process(rows: list[dict[str, Any]], spec: str, max_tokens: int, name: str) -> dict[str, Any]:
    """Submit (in process) → every result in PostgreSQL: the pipeline around the engine."""
    inprocess.clear_answer_cache()
    other = interference.Interference()
    load = os.getloadavg()[0]
    run = pipeline_runs.run_pipeline(
        rows, "--model", spec, "--max-tokens", str(max_tokens), "--grader", "exact", name=name
    )
    return {**run.as_dict(), "loadavg_1m": round(load, 2), "other_load_cores": other.cores()}


def same_share(a: dict[str, Any], b: dict[str, Any]) -> float:
    keys = a.keys() & b.keys()
    same = sum(1 for k in keys if str(a[k] or "").strip() == str(b[k] or "").strip())
    return round(same / len(keys), 4) if keys else 0.0
