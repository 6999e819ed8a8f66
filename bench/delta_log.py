"""Delta table aging: a window's commit time as the table's log grows, with the aggregator's
commit hooks (no log cleanup per commit; `delta.COMMIT_HOOKS`, `DeltaResults`' default) and
with delta-rs' default hooks (which list the whole `_delta_log` after every commit to find
expired log files).

On the bench stack's S3 server, two fresh tables side by side, written like the aggregator
writes its one table: per simulated run, `--windows` window commits of `--rows` rows (each
with its transaction identifier, after the sink's `held`), then the run's compaction. The two
tables take turns window by window, so the machine's noise falls on both alike. Then the
upkeep (`DeltaResults.maintain`) on the aggregator's table, timed. Both tables are deleted
at the end.

    .venv/bin/python bench/delta_log.py [--quick] [--runs 60] [--windows 24] [--rows 300]

Prints JSON and writes bench/results/delta_log.json.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltalake import PostCommitHookProperties

from bench.harness import benchstack, pure, recording
from evalstream.aggregator import delta
from evalstream.aggregator.store import RunMeta
from evalstream.common import storage
from evalstream.common.results import RESULT_COLUMNS
from evalstream.common.settings import S3Settings

ARMS = {
    "aggregator": delta.COMMIT_HOOKS,
    "delta_rs_default": PostCommitHookProperties(),  # cleanup of expired logs after each commit
}


class Table:
    """One table written as the sink writes, with the given post-commit hooks."""

    def __init__(self, uri: str, options: dict[str, str], hooks: PostCommitHookProperties) -> None:
        self.results = delta.DeltaResults(uri, options, hooks=hooks)
        self.window_ms: list[float] = []

    def window(self, run_id: str, window: int, rows: int, offset: int) -> None:
        app = delta.app_id("eval.results", window % 6)
        batch = [
            tuple(
                (
                    dict.fromkeys(RESULT_COLUMNS)
                    | {"run_id": run_id, "item_id": f"{window}-{i}", "response": "x" * 40}
                ).values()
            )
            for i in range(rows)
        ]
        t0 = time.perf_counter()
        self.results.held([app])
        self.results.commit(batch, [], {run_id: RunMeta("null", "m" * 64, "d" * 64)}, {app: offset})
        self.window_ms.append((time.perf_counter() - t0) * 1000)


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--windows", type=int, default=24, help="window commits per run")
    ap.add_argument("--rows", type=int, default=300, help="rows per window")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.windows, args.rows = 10, 12, 100
    started = time.monotonic()
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    env = benchstack.client_env("aggregator")  # the Delta table's writer
    settings = S3Settings.from_env(env)
    options = delta.storage_options(settings)
    prefix = f"{delta.TABLE_PATH}-bench-{time.strftime('%Y%m%d-%H%M%S')}"
    tables = {
        arm: Table(f"s3://{settings.s3_bucket_results}/{prefix}/{arm}", options, hooks)
        for arm, hooks in ARMS.items()
    }
    offset = 0
    try:
        for r in range(args.runs):
            run_id = f"run-{r:04d}"
            for w in range(args.windows):
                offset += args.rows
                for table in tables.values():
                    table.window(run_id, w, args.rows, offset)
            for table in tables.values():
                table.results.compact(run_id)
            if r % 10 == 9:
                recording.log(f"{r + 1}/{args.runs} runs")
        with recording.Timer() as upkeep:
            maintained = tables["aggregator"].results.maintain()
        versions = {arm: t.results.table().version() for arm, t in tables.items()}  # type: ignore[union-attr]
    finally:
        s3 = storage.client(settings)
        for obj in s3.list_objects(settings.s3_bucket_results, prefix=prefix + "/", recursive=True):
            s3.remove_object(settings.s3_bucket_results, obj.object_name)

    span = args.windows * min(10, max(1, args.runs // 3))  # the first and last few runs' windows

    def phases(ms: list[float]) -> dict[str, float]:
        return {
            "early_ms": round(statistics.median(ms[:span]), 1),
            "late_ms": round(statistics.median(ms[-span:]), 1),
        }

    arms = {arm: {**phases(t.window_ms), "versions": versions[arm]} for arm, t in tables.items()}
    for a in arms.values():
        a["growth"] = round(a["late_ms"] / a["early_ms"], 2)
    ours, default = arms["aggregator"], arms["delta_rs_default"]
    recording.write_result(
        "delta_log",
        {
            "params": vars(args),
            "arms": arms,
            "late_ratio_default_to_ours": round(default["late_ms"] / ours["late_ms"], 2),
            "upkeep": {"s": round(upkeep.s, 2), **maintained},
            "goals": [
                pure.goal_row(
                    "delta",
                    "delta_log: a window's Delta commit as the table's log grows",
                    "flat as the log grows (no goal of the issue's: delta-rs' per-commit log listing "
                    "grows with every window)",
                    f"{ours['early_ms']} → {ours['late_ms']} ms ({ours['growth']}×) over {ours['versions']} "
                    f"versions; with delta-rs' default hooks {default['early_ms']} → {default['late_ms']} ms "
                    f"({default['growth']}×); upkeep {upkeep.s:.2f} s",
                    None,
                    "medians of the first and last runs' windows, the two tables taking turns",
                ),
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
