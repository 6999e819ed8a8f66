"""The Delta table writer on a local folder (the same delta-rs code path as on S3, without
the store): idempotent per shard, a redrive's success replaces the failure, compaction
keeps the rows, and DuckDB reads back exactly what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, PostCommitHookProperties

from evalstream.aggregator.delta import (
    COMPACT_ROW_GROUP_ROWS,
    TABLE_CONFIG,
    DeltaMirror,
    DeltaResults,
    RunMeta,
    app_id,
)
from evalstream.common.results import RESULT_COLUMNS, ResultRow
from tests.support import duckdb_delta

META = {"run-a": RunMeta("null", "m" * 64, "d" * 64), "run-b": RunMeta("hf:x", "n" * 64, "e" * 64)}


def row(run_id: str, item_id: str, shard_id: str, error: str | None = None) -> ResultRow:
    out: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
    out.update(
        run_id=run_id,
        item_id=item_id,
        shard_id=shard_id,
        response=None if error else f"answer {item_id}",
        extracted=None if error else item_id,
        correct=None if error else True,
        score=0.0 if error else 1.0,
        error=error,
        attempts=3 if error else 1,
        cache_hit=False,
        latency_ms=12.5,
        served_by="default/null",
        model_revision="rev",
        prompt_tokens=5,
        completion_tokens=2,
        truncated=False,
        category="c",
    )
    return tuple(out[c] for c in RESULT_COLUMNS)


def read(con: duckdb.DuckDBPyConnection, path: Path) -> list[tuple[Any, ...]]:
    return con.execute(
        f"SELECT run_id, item_id, error, model, manifest_sha256 FROM delta_scan('{path}') ORDER BY run_id, item_id"
    ).fetchall()


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    return duckdb_delta()


def test_a_window_commits_its_rows_with_the_offsets_it_covers(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    table = DeltaResults(str(tmp_path), {})
    app = app_id("eval.results", 3)
    assert table.held([app]) == {app: None}
    assert table.commit([row("run-a", "1", "s0"), row("run-a", "2", "s0", error="boom")], [], META, {app: 18})
    assert table.held([app, app_id("eval.results", 4)]) == {app: 18, app_id("eval.results", 4): None}
    version = table.table().version()  # type: ignore[union-attr]
    assert not table.commit([], [], META, {app: 25})  # nothing to write: no commit at all
    assert table.table().version() == version  # type: ignore[union-attr]
    # a later window: item 2 redriven to a success (merged), item 3 new
    assert table.commit([row("run-a", "3", "s0")], [row("run-a", "2", "s0")], META, {app: 30})
    assert table.held([app]) == {app: 30}
    assert read(con, tmp_path) == [
        ("run-a", "1", None, "null", "m" * 64),
        ("run-a", "2", None, "null", "m" * 64),
        ("run-a", "3", None, "null", "m" * 64),
    ]


def test_a_merge_inserts_what_is_missing_and_never_replaces_a_success(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    table = DeltaResults(str(tmp_path), {})
    table.commit([row("run-a", "1", "s0")], [], META, {})
    # a stale failure of the same item beside a new one (the database never does this, the table holds anyway)
    table.commit([], [row("run-a", "1", "s0", error="late"), row("run-a", "2", "s0")], META, {})
    table.commit([], [row("run-a", "2", "s0")], META, {})  # merged again: still one row
    assert [r[:3] for r in read(con, tmp_path)] == [("run-a", "1", None), ("run-a", "2", None)]


def test_runs_are_partitions_and_compaction_keeps_rows_and_offsets(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    table = DeltaResults(str(tmp_path), {})
    app = app_id("eval.results", 0)
    for i in range(6):
        table.commit([row("run-a", f"{i}-{j}", f"s{i}") for j in range(3)], [], META, {app: 10 * (i + 1)})
    table.commit([row("run-b", "x", "s0")], [], META, {})
    before = read(con, tmp_path)
    files = len([f for f in table.table().file_uris() if "run_id=run-a" in f])  # type: ignore[union-attr]
    assert files == 6
    metrics = table.compact("run-a")
    assert metrics["numFilesRemoved"] == 6 and metrics["numFilesAdded"] == 1
    assert len([f for f in table.table().file_uris() if "run_id=run-a" in f]) == 1  # type: ignore[union-attr]
    assert read(con, tmp_path) == before
    assert len(before) == 19
    # compaction keeps the transaction identifiers: a window redone after it is recognised
    assert table.held([app]) == {app: 60}


def test_compaction_writes_a_big_run_in_bounded_row_groups(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    """The writer holds one row group in memory: a run of any size compacts into one file
    of bounded row groups, not one row group of the whole run."""
    table = DeltaResults(str(tmp_path), {})
    windows, per_window = 5, 1500  # 7,500 rows: more than three row groups
    for i in range(windows):
        table.commit([row("run-a", f"{i}-{j}", f"s{i}") for j in range(per_window)], [], META, {})
    table.compact("run-a")
    (uri,) = table.table().file_uris()  # type: ignore[union-attr]
    meta = pq.ParquetFile(uri).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sum(groups) == windows * per_window
    assert max(groups) <= COMPACT_ROW_GROUP_ROWS and len(groups) == -(
        -windows * per_window // COMPACT_ROW_GROUP_ROWS
    )
    assert len(read(con, tmp_path)) == windows * per_window


# Retentions of zero and a checkpoint every 5 commits: what a long-lived table reaches after
# days shows after a dozen commits.
SHORT = {
    "delta.setTransactionRetentionDuration": "interval 30 days",
    "delta.logRetentionDuration": "interval 0 hours",
    "delta.deletedFileRetentionDuration": "interval 0 hours",
    "delta.checkpointInterval": "5",
}


def commits_in_log(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def data_files(path: Path, run_id: str) -> int:
    return len(list((path / f"run_id={run_id}").glob("*.parquet")))


def test_windows_leave_the_log_to_upkeep_which_deletes_what_expired(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    """A window's commit must not clean the log (delta-rs lists the whole log to do it);
    upkeep does: the log files behind the latest checkpoint go, the table and its
    transaction identifiers stay."""
    table = DeltaResults(str(tmp_path), {}, config=SHORT)
    app = app_id("eval.results", 0)
    for i in range(12):
        table.commit([row("run-a", str(i), "s0")], [], META, {app: i + 1})
    assert commits_in_log(tmp_path) == list(range(12))  # versions 0-11, checkpoints at 4 and 9
    done = table.maintain()
    assert done == {"properties_set": 0, "files_vacuumed": 0}  # nothing replaced, nothing to vacuum
    assert commits_in_log(tmp_path) == [9, 10, 11]  # from the latest checkpoint on
    assert len(read(con, tmp_path)) == 12
    assert DeltaResults(str(tmp_path), {}).held([app]) == {app: 12}  # a new reader of the cleaned log


def test_other_hooks_are_the_callers_choice(tmp_path: Path) -> None:
    """`hooks` replaces COMMIT_HOOKS on every commit (bench/delta_log.py compares delta-rs'
    default ones, which clean the log after each commit)."""
    table = DeltaResults(str(tmp_path), {}, config=SHORT, hooks=PostCommitHookProperties())
    app = app_id("eval.results", 0)
    for i in range(12):
        table.commit([row("run-a", str(i), "s0")], [], META, {app: i + 1})
    assert commits_in_log(tmp_path) == [9, 10, 11]


def test_upkeep_vacuums_the_files_a_compaction_replaced(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    table = DeltaResults(str(tmp_path), {}, config=SHORT)
    for i in range(4):
        table.commit([row("run-a", f"{i}-{j}", f"s{i}") for j in range(3)], [], META, {})
    table.commit([row("run-b", "x", "s0")], [], META, {})
    before = read(con, tmp_path)
    table.compact("run-a")
    assert data_files(tmp_path, "run-a") == 5  # four windows' files and the compacted one
    assert table.maintain()["files_vacuumed"] == 4
    assert data_files(tmp_path, "run-a") == 1 and data_files(tmp_path, "run-b") == 1
    assert read(con, tmp_path) == before


def test_upkeep_keeps_replaced_files_for_the_retention_and_brings_an_older_table_to_it(
    tmp_path: Path,
) -> None:
    """A table made by an earlier version (only the transaction retention set) takes on the
    retentions at its first upkeep, and a compaction's inputs stay on disk for a day."""
    older = DeltaResults(
        str(tmp_path), {}, config={"delta.setTransactionRetentionDuration": "interval 30 days"}
    )
    for i in range(3):
        older.commit([row("run-a", str(i), "s0")], [], META, {})
    older.compact("run-a")
    table = DeltaResults(str(tmp_path), {})
    assert table.maintain() == {"properties_set": 2, "files_vacuumed": 0}
    assert data_files(tmp_path, "run-a") == 4
    configured = DeltaTable(str(tmp_path)).metadata().configuration
    assert {k: configured.get(k) for k in TABLE_CONFIG} == TABLE_CONFIG
    assert table.maintain() == {"properties_set": 0, "files_vacuumed": 0}


class CountingResults:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def maintain(self) -> dict[str, int]:
        self.calls += 1
        if self.fail:
            raise OSError("store away")
        return {}


async def test_upkeep_runs_at_most_once_an_interval_and_a_failure_waits_for_the_next() -> None:
    results = CountingResults()
    mirror = DeltaMirror(results, store=None, maintenance_s=3600)  # type: ignore[arg-type]
    assert await mirror.maintain() and not await mirror.maintain()
    assert results.calls == 1
    every_time = DeltaMirror(results, store=None, maintenance_s=0)  # type: ignore[arg-type]
    assert await every_time.maintain() and await every_time.maintain()
    assert results.calls == 3
    failing = CountingResults(fail=True)
    mirror = DeltaMirror(failing, store=None, maintenance_s=3600)  # type: ignore[arg-type]
    assert await mirror.maintain()  # logged, not raised: the window that called it goes on
    assert not await mirror.maintain() and failing.calls == 1
