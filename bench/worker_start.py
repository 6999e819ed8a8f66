"""5. Worker start: from process start until the worker takes its first shard.

A one-item job on the default model (the bundled model's name: the worker's fastest faithful
engine, `ov:` on a CPU) is submitted while the worker is stopped (the router holds its shard
until a worker of the group is live), then the worker is started and its /metrics polled
until it has picked up a shard (the queue_wait histogram's first observation). Cold: a
fresh, empty MODEL_CACHE_DIR, so the GGUF file is de-quantised and saved as safetensors
(and, for `ov:`, converted to an OpenVINO IR) first. Warm: the same folder afterwards. The
worker's own log gives the model's share: "loading the main model" (the preload's start),
the engine's own "loaded … in" (model files to engine) and "engine … loaded in" (the whole
load, imports included). `--model SPEC` measures another main model (e.g.
hf:smollm2-135m-instruct). Goal: warm ≤ 5 s (median of repeats); the cold ÷ warm ratio is
reported too.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    benchstack,
    data,
    inprocess,
    paths,
    pipeline_runs,
    procstat,
    profiled,
    pure,
    recording,
)
from evalstream.common.settings import WorkerSettings
from evalstream.common.specs import DEFAULT_MODEL

NAME = "worker_start"
GOAL_S = 5.0
PRELOAD = re.compile(r"loading the main model (\S+)")  # the preload's start (engine_registry)
# the preload's (imports + weights; before the preload, the lifespan's, without the engine)
LOADED = re.compile(r"engine (\S+) loaded in ([\d.]+)s(?: on \S+: (\S+))?")
WEIGHTS = re.compile(r"loaded (\S+) on (.+?) in ([\d.]+) s")  # HFEngine's / OpenVINOEngine's own


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


def log_events(log: Path, since_bytes: int) -> dict[str, Any]:
    """Timestamps (Unix time) of the start-up lines the worker logged after `since_bytes`."""
    out: dict[str, Any] = {}
    for rec in benchstack.log_records(log, since_bytes):
        msg, ts = str(rec.get("msg", "")), rec.get("ts")
        if not ts:
            continue
        t = datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
        if PRELOAD.search(msg) and "preload_started" not in out:
            out["preload_started"] = t
        m = LOADED.search(msg)
        if m and "engine_loaded" not in out:
            out["engine_loaded"] = t
            out["engine_load_s"] = float(m.group(2))
            out["engine"] = m.group(3) or m.group(1)
        w = WEIGHTS.search(msg)
        if w and "weights_s" not in out:
            out["weights_s"] = float(w.group(3))
        if "de-quantising" in msg and "dequantise_started" not in out:
            out["dequantise_started"] = t
    return out


def one_start(cache_dir: Path, label: str, index: int, model: str) -> dict[str, Any]:
    benchstack.stack("stop", "worker-0")
    rows = data.arithmetic_rows(1, seed=5000 + index, prefix=f"ws{index}-")
    path = data.write_jsonl(data.data_dir() / f"worker-start-{index}.jsonl", rows)
    inprocess.clear_answer_cache()
    run_id = pipeline_runs.submit(
        path,
        "--max-tokens",
        "8",
        "--grader",
        "exact",
        "--name",
        f"bench-worker-start-{label}",
        "--model",
        model,
    )
    asyncio.run(_published(run_id, 60))
    time.sleep(0.5)  # the router has the shard and holds it: no live worker
    log = benchstack.stack_dir() / "logs" / "worker-0.log"
    offset = log.stat().st_size if log.exists() else 0
    # the model measured is the group's main model (the first SPEC of WORKER_MODEL)
    env = {"MODEL_CACHE_DIR": str(cache_dir), "WORKER_MODEL": f"{model},{WorkerSettings.worker_model}"}
    pid = profiled.spawn("worker-0", [str(paths.ROOT / ".venv" / "bin" / "evalstream-worker")], env)
    benchstack.set_worker_env(env)
    t_proc = profiled.process_start_epoch(pid)
    t_first = first_shard_s(pid, timeout=600)
    events = log_events(log, offset)
    asyncio.run(pipeline_runs.wait_results(run_id, 1, 300, 0.1))
    res = {
        "case": label,
        "model": model,
        "engine": events.get("engine"),
        "first_shard_s": round(t_first - t_proc, 3),
        "engine_loaded_s": round(events["engine_loaded"] - t_proc, 3) if "engine_loaded" in events else None,
        "engine_load_s": events.get("engine_load_s"),
        "breakdown_s": {
            # the interpreter and the entry point's few imports, until the preload starts
            "interpreter_to_model_load": round(events["preload_started"] - t_proc, 3)
            if "preload_started" in events
            else None,
            # the engine's libraries: openvino (ov:) or torch and transformers (hf:)
            "engine_imports": round(events["engine_load_s"] - events["weights_s"], 3)
            if "engine_load_s" in events and "weights_s" in events
            else None,
            "model_files_to_engine": events.get("weights_s"),
            # the service's imports, connections and group join run beside the load
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


BREAKDOWN = ("interpreter_to_model_load", "engine_imports", "model_files_to_engine", "engine_to_first_shard")


def explain(warm: list[dict[str, Any]]) -> str:
    parts = {}
    for key in BREAKDOWN:
        values = [w["breakdown_s"][key] for w in warm if w["breakdown_s"].get(key) is not None]
        parts[key] = pure.summarize(values)["median"]
    total = pure.summarize([w["first_shard_s"] for w in warm])["median"]
    shown = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in parts.items() if v is not None)
    return (
        f"warm start {total:.1f} s (median): {shown}. The model's load is the critical path (the service's "
        "imports, connections and group join run beside it); on two shared cores a busy machine stretches "
        "every part of it (see loadavg_at_start)."
    )


def main() -> None:
    parser = recording.arg_parser(__doc__)
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"the worker's main model (default {DEFAULT_MODEL})"
    )
    parser.add_argument("--warm-repeats", type=int, help="warm starts (default 3; --quick: 1)")
    parser.add_argument(
        "--keep-cache",
        type=Path,
        help="warm starts only, with this MODEL_CACHE_DIR kept between runs (filled by an untimed start "
        "if empty): to compare two checkouts start for start; the result goes to --name",
    )
    parser.add_argument("--name", default=NAME, help=f"bench/results/<name>.json (default {NAME})")
    args = parser.parse_args()
    started = time.monotonic()
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    warm_repeats = args.warm_repeats or (1 if args.quick else 3)
    cache_dir = args.keep_cache or benchstack.stack_dir() / "bench-model-cache"
    if args.keep_cache is None:
        shutil.rmtree(cache_dir, ignore_errors=True)
    # a cold start may take longer than the router's default wait for a live group
    benchstack.restart(["router"], env={"ROUTER_NO_GROUP_TIMEOUT_S": "900"})
    try:
        cold = (
            None
            if args.keep_cache and any(cache_dir.glob("*/*.json"))
            else one_start(cache_dir, "cold", 0, args.model)
        )
        budget = profiled.Budget(150, 2)
        warm = [one_start(cache_dir, "warm", 1 + i, args.model) for i in budget.range(warm_repeats)]
    finally:
        benchstack.stack("stop", "worker-0")
        benchstack.set_worker_env({})  # the router's restart brings the default worker back
        benchstack.restart(["router"])
        if args.keep_cache is None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    warm_s = pure.summarize([w["first_shard_s"] for w in warm])
    med = warm_s["median"]
    ratio = cold["first_shard_s"] / med if med and cold else None
    cold_s = cold["first_shard_s"] if cold else None
    recording.write_result(
        args.name,
        {
            "time_allowance": budget.as_dict(),
            "params": {
                "model": args.model,
                "engine": warm[0].get("engine") if warm else None,
                "warm_repeats": warm_repeats,
            },
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
                    f"{pure.fmt_num(med)} s (median of {warm_s['n']}); cold GGUF {pure.fmt_num(cold_s)} s "
                    f"= {pure.fmt_num(ratio)}× warm",
                    med is not None and med <= GOAL_S,
                    f"{warm[0].get('engine') if warm else args.model}; model load "
                    f"{pure.fmt_num(pure.summarize([w['engine_load_s'] or 0 for w in warm])['median'])} s of it warm, "
                    f"{pure.fmt_num(cold['engine_load_s'] if cold else None)} s cold",
                )
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
