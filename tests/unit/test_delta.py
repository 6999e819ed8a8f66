"""The Delta table writer on a local folder (the same delta-rs code path as on S3, without
the store): idempotent per shard, a redrive's success replaces the failure, compaction
keeps the rows, and DuckDB reads back exactly what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest

from evalstream.aggregator.delta import COMPACT_ROW_GROUP_ROWS, DeltaResults, RunMeta, app_id
from evalstream.common.results import RESULT_COLUMNS
from tests.support import duckdb_delta

META = {"run-a": RunMeta("null", "m" * 64, "d" * 64), "run-b": RunMeta("hf:x", "n" * 64, "e" * 64)}


def row(run_id: str, item_id: str, shard_id: str, error: str | None = None) -> dict[str, Any]:
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
    return out


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
