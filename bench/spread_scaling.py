"""11. One run over one group scales: the same fresh run on 1, 3 and 6 workers of one group.

A run of ITEMS items on the `null` engine with a per-item delay (ENGINE_DELAY_MS, standing in
for a GPU: a batch of n items takes n × delay) goes through the bench stack with 1, 3 and 6
workers in the default group; each configuration is brought up, waited for until every worker
is a member of the group's consumer group with a partition, then a fresh run (new run id,
same items) is timed from `evalctl submit` (in process) to its last result in PostgreSQL.
Each worker's share is the items it answered (its evalstream_items_total counter, before
and after). Repeats rotate the order of the configurations; medians are reported.

Goals (issue 23): speed-up ≥ 2.7× at 3 workers and ≥ 5× at 6; each of 3 workers serves
≥ 25 % of the run.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import benchstack, data, pipeline_runs, pure, recording
from bench.harness.pure import metric_sum
from evalstream.common.topics import worker_consumer_group

NAME = "spread_scaling"
ITEMS = 12_000
DELAY_MS = 5
WORKERS = (1, 3, 6)
GOAL_3, GOAL_6, GOAL_SHARE_3 = 2.7, 5.0, 0.25


def dataset(n: int) -> Path:
    path = data.data_dir() / f"spread-{n}.jsonl"
    if not path.exists():
        data.write_jsonl(
            path,
            ({"id": f"s{i:06d}", "question": f"What is {i} + 2?", "answer": str(i + 2)} for i in range(n)),
        )
    return path


def answered(workers: int) -> list[float]:
    """Items each worker has answered so far (its own counter)."""
    return [
        metric_sum(
            benchstack.metrics(f"worker-{i}"), "evalstream_items_total", service="worker", status="succeeded"
        )
        for i in range(workers)
    ]


def bring_up(workers: int) -> float:
    """The stack with `workers` workers, each a member of the group holding a partition."""
    t0 = time.monotonic()
    benchstack.ensure_up({"WORKER_MODEL": "null", "ENGINE_DELAY_MS": str(DELAY_MS)}, workers=workers)
    benchstack.wait_groups_settled(
        {worker_consumer_group("default"): ("user", workers, min(workers, 6))}, timeout=180
    )
    return time.monotonic() - t0


def one_run(workers: int) -> dict[str, Any]:
    before = answered(workers)
    run = pipeline_runs.run_pipeline(
        dataset(ITEMS), "--model", "null", total=ITEMS, name=f"bench-spread-{workers}", poll_s=0.1
    )
    shares = [b - a for a, b in zip(before, answered(workers), strict=True)]
    return {
        "workers": workers,
        "elapsed_s": round(run.elapsed_s, 3),
        "submit_s": round(run.submit_s, 3),
        "items_per_s": round(run.items_per_s, 1),
        "served": shares,
        "shares": [round(s / max(1, sum(shares)), 4) for s in shares],
        "run_id": run.run_id,
        "failed": run.failed,
    }


def main() -> None:
    args = recording.arg_parser(__doc__).parse_args()
    started = time.monotonic()
    benchstack.use_bench_stack()
    repeats = 1 if args.quick else 3
    runs: list[dict[str, Any]] = []
    try:
        for r in range(repeats):
            order = WORKERS[r % len(WORKERS) :] + WORKERS[: r % len(WORKERS)]  # rotating order
            for n in order:
                settle_s = bring_up(n)
                result = one_run(n)
                result["settle_s"] = round(settle_s, 1)
                result["repeat"] = r
                recording.log(
                    f"{n} worker(s): {result['elapsed_s']:.1f} s, {result['items_per_s']:,.0f} items/s, "
                    f"shares {result['shares']}"
                )
                runs.append(result)
    finally:
        benchstack.ensure_up()  # the default worker again, for the next benchmark
    median = {n: statistics.median(r["elapsed_s"] for r in runs if r["workers"] == n) for n in WORKERS}
    speedup = {n: round(median[1] / median[n], 2) for n in WORKERS}
    min_share_3 = min(min(r["shares"]) for r in runs if r["workers"] == 3)
    recording.write_result(
        NAME,
        {
            "params": {"items": ITEMS, "delay_ms": DELAY_MS, "workers": list(WORKERS), "repeats": repeats},
            "runs": runs,
            "median_elapsed_s": {str(n): round(v, 3) for n, v in median.items()},
            "speedup": {str(n): v for n, v in speedup.items()},
            "min_share_at_3": min_share_3,
            "goals": [
                pure.goal_row(
                    "11a",
                    f"one run ({ITEMS:,} items, null + {DELAY_MS} ms/item) on 3 workers of one group: speed-up",
                    f"≥ {GOAL_3}×",
                    f"{speedup[3]}×",
                    speedup[3] >= GOAL_3,
                    f"median s: 1 worker {median[1]:.1f}, 3 workers {median[3]:.1f}",
                ),
                pure.goal_row(
                    "11b",
                    "the same run on 6 workers: speed-up",
                    f"≥ {GOAL_6}×",
                    f"{speedup[6]}×",
                    speedup[6] >= GOAL_6,
                    f"median s: 6 workers {median[6]:.1f}",
                ),
                pure.goal_row(
                    "11c",
                    "each of 3 workers' share of the run, lowest over the repeats",
                    f"≥ {GOAL_SHARE_3:.0%}",
                    f"{min_share_3:.1%}",
                    min_share_3 >= GOAL_SHARE_3,
                    "items each worker answered (its own counter)",
                ),
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
