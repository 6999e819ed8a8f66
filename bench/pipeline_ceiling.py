"""3. Pipeline ceiling: the `null` engine (instant empty answers), 15,000 and 150,000 items.

The worker serves only `null` (no model loaded). For each size the four services are
restarted (so that each one's peak RSS, VmHWM, starts afresh), a small warm-up run goes
through, then the measured run: `evalctl submit` (in-process) -> every result in
PostgreSQL. Reported: items/s end to end (and from publish), CPU seconds per item of every
stack process (from /proc: producer, router, worker, aggregator, Kafka, PostgreSQL with its
backends, SeaweedFS), and the peak RSS of each service at both sizes.

Goals: ≥ 10,000 items/s at 150k; memory flat in the number of items (here: each service's
peak at 150k ≤ 1.25 × its peak at 15k). Below the throughput goal, a third run of the
smaller size goes through with every service under bench/sampler.py (CPU-weighted stack
samples across threads) and the top functions per service are reported.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common as c

NAME = "pipeline_ceiling"
GOAL_ITEMS_PER_S = 10_000
MEMORY_FLAT = 1.25
SERVICES = ["producer", "router", "worker-0", "aggregator"]
INFRA = ["kafka", "postgres", "s3"]
WORKER_ENV = {"WORKER_MODEL": "null"}


def dataset(n: int) -> Path:
    path = c.data_dir() / f"ceiling-{n}.jsonl"
    if not path.exists():
        c.write_jsonl(
            path,
            (
                {"id": f"n{i:07d}", "question": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)}
                for i in range(n)
            ),
        )
    return path


def measure(n: int, *, shard_args: list[str], profile_dir: Path | None = None) -> dict[str, Any]:
    if profile_dir is None:
        c.restart(SERVICES)
    else:
        for name in SERVICES:
            c.start_sampled(name, profile_dir / name, WORKER_ENV if name.startswith("worker") else None)
    ready_s = c.wait_pipeline_ready()
    c.run_pipeline(dataset(200), "--model", "null", *shard_args, total=200, name="bench-ceiling-warmup")
    if profile_dir is not None:  # profile the measured run only, not start-up and warm-up
        for name in SERVICES:
            if (pid := c.pid_of(name)) is not None:
                os.kill(pid, signal.SIGUSR1)
    meter = c.CpuMeter([*SERVICES, *INFRA])
    meter.start()
    run = c.run_pipeline(
        dataset(n), "--model", "null", *shard_args, total=n, name=f"bench-ceiling-{n}", poll_s=0.5
    )
    cpu = meter.stop()
    peaks = {name: c.peak_rss_bytes(pid) for name in SERVICES if (pid := c.pid_of(name)) is not None}
    after_publish = run.elapsed_s - run.submit_s
    c.log(
        f"{n} items: {run.items_per_s:,.0f} items/s end to end ({run.elapsed_s:.1f} s, submit {run.submit_s:.1f} s), "
        f"peaks MiB { ({k: round((v or 0) / 2**20) for k, v in peaks.items()}) }"
    )
    return {
        "items": n,
        "run": run.as_dict(),
        "items_per_s_from_publish": round(n / after_publish, 1) if after_publish > 0 else None,
        "ready_s": round(ready_s, 2),
        "cpu_s": cpu,
        "cpu_us_per_item": {k: round(v / n * 1e6, 1) for k, v in cpu.items()},
        "cpu_total_us_per_item": round(sum(cpu.values()) / n * 1e6, 1),
        "peak_rss_bytes": peaks,
    }


def main() -> None:
    args = c.arg_parser(__doc__).parse_args()
    started = time.monotonic()
    c.use_bench_stack()
    c.ensure_up(WORKER_ENV)
    small, large = (1_500, 15_000) if args.quick else (15_000, 150_000)
    shard_args: list[str] = []  # the CLI's default shard size
    try:
        runs = [measure(small, shard_args=shard_args), measure(large, shard_args=shard_args)]
        big = runs[1]
        ips = big["run"]["items_per_s"]
        growth = {
            name: round(big["peak_rss_bytes"][name] / runs[0]["peak_rss_bytes"][name], 3)
            for name in SERVICES
            if big["peak_rss_bytes"].get(name) and runs[0]["peak_rss_bytes"].get(name)
        }
        worst = max(growth.values()) if growth else None
        profile = None
        if ips < GOAL_ITEMS_PER_S:
            c.log("under the throughput goal: profiling every service (sampled) on the smaller size")
            pdir = c.RESULTS / f"{NAME}.profile"
            pdir.mkdir(parents=True, exist_ok=True)
            prof_run = measure(small, shard_args=shard_args, profile_dir=pdir)
            for name in SERVICES:  # stopping them writes their final samples
                c.stack("stop", name)
            profile = {"run": prof_run, "services": {}}
            for name in SERVICES:
                path = pdir / f"{name}.json"
                if path.exists():
                    data = json.loads(path.read_text())
                    profile["services"][name] = {
                        "sampled_cpu_s": data["sampled_cpu_s"],
                        "self_top": data["self"][:12],
                        "inclusive_top": data["inclusive"][:20],
                    }
    finally:
        c.ensure_up()  # the default worker again, for the next benchmark
    cpu_note = ", ".join(f"{k} {v:.0f}" for k, v in big["cpu_us_per_item"].items())
    c.write_result(
        NAME,
        {
            "params": {
                "sizes": [small, large],
                "model": "null",
                "shard_size": "CLI default",
                "memory_flat_max_growth": MEMORY_FLAT,
            },
            "runs": runs,
            "peak_rss_growth": growth,
            "profile": profile,
            "goals": [
                c.goal_row(
                    "3a",
                    f"pipeline ceiling, null engine, {large:,} items (items/s end to end)",
                    f"≥ {GOAL_ITEMS_PER_S:,}",
                    f"{c.fmt_num(ips)} items/s (from publish: {c.fmt_num(big['items_per_s_from_publish'])})",
                    ips >= GOAL_ITEMS_PER_S,
                    f"CPU µs/item: {cpu_note}",
                ),
                c.goal_row(
                    "3b",
                    f"memory flat: peak RSS at {large:,} ÷ at {small:,} items, worst service",
                    f"≤ {MEMORY_FLAT}",
                    f"{c.fmt_num(worst)}",
                    worst is not None and worst <= MEMORY_FLAT,
                    ", ".join(
                        f"{k} {round((runs[0]['peak_rss_bytes'][k] or 0) / 2**20)}→{round((big['peak_rss_bytes'][k] or 0) / 2**20)} MiB"
                        for k in growth
                    ),
                ),
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
