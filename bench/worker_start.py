"""5. Worker start: from process start until the worker takes its first shard.

A one-item job on the default model is submitted while the worker is stopped (the router
holds its shard until a worker of the group is live), then the worker is started and its
/metrics polled until it has picked up a shard (the queue_wait histogram's first
observation). Cold: a fresh, empty MODEL_CACHE_DIR, so the GGUF file is de-quantised and
saved as safetensors first. Warm: the same folder afterwards, the cached safetensors
loaded. The worker's own log gives the model's share (its "engine … loaded in" line).
Goal: warm ≤ 5 s (median of repeats); the cold ÷ warm ratio is reported too.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import benchstack, data, inprocess, paths, pipeline_runs, procstat, profiled, pure, recording

NAME = "worker_start"
GOAL_S = 5.0
LOADED = re.compile(r"engine (\S+) loaded in ([\d.]+)s")  # the lifespan's: imports + weights
WEIGHTS = re.compile(r"loaded (\S+) on (\S+) in ([\d.]+) s")  # HFEngine's: weights and tokenizer


async def _published(run_id: str, timeout: float) -> None:
    import asyncpg

    conn = await asyncpg.connect(os.environ["DATABASE_URL"])
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await conn.fetchval("SELECT published_at IS NOT NULL FROM runs WHERE run_id = $1", run_id):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"run {run_id} was not published within {timeout:.0f}s")
    finally:
        await conn.close()


def first_shard_s(pid: int, timeout: float) -> float:
    """Unix time at which the worker's metrics first show a shard taken."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = benchstack.metrics("worker-0")
            if pure.metric_sum(m, "evalstream_stage_latency_seconds_count", stage="queue_wait") >= 1:
                return time.time()
        except OSError:
            pass  # not listening yet (uvicorn binds after the lifespan has loaded the model)
        if procstat.pid_of("worker-0") != pid:
            raise RuntimeError("the worker exited during start; see its log")
        time.sleep(0.05)
    raise TimeoutError(f"the worker took no shard within {timeout:.0f}s")


def log_events(log: Path, since_bytes: int) -> dict[str, float]:
    """Timestamps (Unix time) of the start-up lines the worker logged after `since_bytes`."""
    out: dict[str, float] = {}
    with log.open("rb") as f:
        f.seek(since_bytes)
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            msg, ts = str(rec.get("msg", "")), rec.get("ts")
            if not ts:
                continue
            t = datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
            out.setdefault("first_log", t)  # the interpreter and the service's modules are in
            m = LOADED.search(msg)
            if m and "engine_loaded" not in out:
                out["engine_loaded"] = t
                out["engine_load_s"] = float(m.group(2))
            w = WEIGHTS.search(msg)
            if w and "weights_s" not in out:
                out["weights_s"] = float(w.group(3))
            if "de-quantising" in msg and "dequantise_started" not in out:
                out["dequantise_started"] = t
    return out


def one_start(cache_dir: Path, label: str, index: int) -> dict[str, Any]:
    benchstack.stack("stop", "worker-0")
    rows = data.arithmetic_rows(1, seed=5000 + index, prefix=f"ws{index}-")
    path = data.write_jsonl(data.data_dir() / f"worker-start-{index}.jsonl", rows)
    inprocess.clear_answer_cache()
    run_id = pipeline_runs.submit(
        path, "--max-tokens", "8", "--grader", "exact", "--name", f"bench-worker-start-{label}"
    )
    asyncio.run(_published(run_id, 60))
    time.sleep(0.5)  # the router has the shard and holds it: no live worker
    log = benchstack.stack_dir() / "logs" / "worker-0.log"
    offset = log.stat().st_size if log.exists() else 0
    env = {"MODEL_CACHE_DIR": str(cache_dir)}
    pid = profiled.spawn("worker-0", [str(paths.ROOT / ".venv" / "bin" / "evalstream-worker")], env)
    benchstack.set_worker_env(env)
    t_proc = profiled.process_start_epoch(pid)
    t_first = first_shard_s(pid, timeout=600)
    events = log_events(log, offset)
    asyncio.run(pipeline_runs.wait_results(run_id, 1, 300, 0.1))
    res = {
        "case": label,
        "first_shard_s": round(t_first - t_proc, 3),
        "engine_loaded_s": round(events["engine_loaded"] - t_proc, 3) if "engine_loaded" in events else None,
        "engine_load_s": events.get("engine_load_s"),
        "breakdown_s": {
            "interpreter_and_service_imports": round(events["first_log"] - t_proc, 3)
            if "first_log" in events
            else None,
            "torch_transformers_import": round(events["engine_load_s"] - events["weights_s"], 3)
            if "engine_load_s" in events and "weights_s" in events
            else None,
            "model_files_to_engine": events.get("weights_s"),
            "engine_to_first_shard": round(t_first - events["engine_loaded"], 3)
            if "engine_loaded" in events
            else None,
        },
        "model_cache_dir": str(cache_dir),
    }
    recording.log(
        f"{label}: first shard after {res['first_shard_s']:.2f} s (engine loaded at {res['engine_loaded_s']} s)"
    )
    return res


def explain(warm: list[dict[str, Any]]) -> str:
    parts = {}
    for key in (
        "interpreter_and_service_imports",
        "torch_transformers_import",
        "model_files_to_engine",
        "engine_to_first_shard",
    ):
        values = [w["breakdown_s"][key] for w in warm if w["breakdown_s"].get(key) is not None]
        parts[key] = pure.summarize(values)["median"]
    total = pure.summarize([w["first_shard_s"] for w in warm])["median"]
    shown = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in parts.items() if v is not None)
    return (
        f"warm start {total:.1f} s (median): {shown}. Importing torch and transformers and reading the "
        "538 MB fp32 safetensors come first and one after the other; only then does the worker connect to "
        "PostgreSQL and Kafka and join its group. Doing those connections and the group join while the model "
        "loads (the engine is needed only when the first shard arrives), and importing only the model's own "
        "transformers modules, would take the parts that are not the weights off the critical path."
    )


def main() -> None:
    args = recording.arg_parser(__doc__).parse_args()
    started = time.monotonic()
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    warm_repeats = 1 if args.quick else 3
    cache_dir = benchstack.stack_dir() / "bench-model-cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    # a cold start may take longer than the router's default wait for a live group
    benchstack.restart(["router"], env={"ROUTER_NO_GROUP_TIMEOUT_S": "900"})
    try:
        cold = one_start(cache_dir, "cold", 0)
        budget = profiled.Budget(150, 2)
        warm = [one_start(cache_dir, "warm", 1 + i) for i in budget.range(warm_repeats)]
    finally:
        benchstack.stack("stop", "worker-0")
        benchstack.set_worker_env({})  # the router's restart brings the default worker back
        benchstack.restart(["router"])
        shutil.rmtree(cache_dir, ignore_errors=True)
    warm_s = pure.summarize([w["first_shard_s"] for w in warm])
    med = warm_s["median"]
    ratio = cold["first_shard_s"] / med if med else None
    recording.write_result(
        NAME,
        {
            "time_allowance": budget.as_dict(),
            "params": {"model": paths.DEFAULT_MODEL, "warm_repeats": warm_repeats},
            "cold": cold,
            "warm": warm,
            "warm_first_shard_s": warm_s,
            "cold_over_warm": round(ratio, 3) if ratio else None,
            "diagnosis": [] if med is not None and med <= GOAL_S else [explain(warm)],
            "goals": [
                pure.goal_row(
                    "5",
                    "worker start to first shard, cached safetensors (warm)",
                    f"≤ {GOAL_S:.0f} s",
                    f"{pure.fmt_num(med)} s (median of {warm_s['n']}); cold GGUF {pure.fmt_num(cold['first_shard_s'])} s "
                    f"= {pure.fmt_num(ratio)}× warm",
                    med is not None and med <= GOAL_S,
                    f"model load {pure.fmt_num(pure.summarize([w['engine_load_s'] or 0 for w in warm])['median'])} s of it warm, "
                    f"{pure.fmt_num(cold['engine_load_s'])} s cold",
                )
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
