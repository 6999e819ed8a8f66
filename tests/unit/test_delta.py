"""The Delta table writer on a local folder (the same delta-rs code path as on S3, without
the store): idempotent per shard, a redrive's success replaces the failure, compaction
keeps the rows, and DuckDB reads back exactly what was written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from evalstream.aggregator.delta import DeltaResults, RunMeta, shard_version
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


def test_a_redelivered_shard_adds_nothing_and_a_redrive_replaces_the_failure(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    table = DeltaResults(str(tmp_path), {})
    first = {("run-a", "s0"): [row("run-a", "1", "s0"), row("run-a", "2", "s0", error="boom")]}
    assert table.write(first, META) == 1
    version = table.table().version()  # type: ignore[union-attr]
    assert table.write(first, META) == 0  # redelivered: the shard's version is already held
    assert table.table().version() == version  # type: ignore[union-attr]  # not even an empty commit
    # the rest of the shard arrives, item 2 redriven to a success
    later = {("run-a", "s0"): [row("run-a", "1", "s0"), row("run-a", "2", "s0"), row("run-a", "3", "s0")]}
    assert shard_version(later[("run-a", "s0")]) > shard_version(first[("run-a", "s0")])
    assert table.write(later, META) == 1
    assert table.write(later, META) == 0
    assert read(con, tmp_path) == [
        ("run-a", "1", None, "null", "m" * 64),
        ("run-a", "2", None, "null", "m" * 64),
        ("run-a", "3", None, "null", "m" * 64),
    ]


def test_a_success_is_never_replaced(tmp_path: Path, con: duckdb.DuckDBPyConnection) -> None:
    table = DeltaResults(str(tmp_path), {})
    table.write({("run-a", "s0"): [row("run-a", "1", "s0")]}, META)
    # a stale failure of the same item beside a new one (the database never does this, the table holds anyway)
    table.write({("run-a", "s0"): [row("run-a", "1", "s0", error="late"), row("run-a", "2", "s0")]}, META)
    assert [r[:3] for r in read(con, tmp_path)] == [("run-a", "1", None), ("run-a", "2", None)]


def test_runs_are_partitions_and_compaction_keeps_every_row(
    tmp_path: Path, con: duckdb.DuckDBPyConnection
) -> None:
    table = DeltaResults(str(tmp_path), {})
    for i in range(6):
        table.write({("run-a", f"s{i}"): [row("run-a", f"{i}-{j}", f"s{i}") for j in range(3)]}, META)
    table.write({("run-b", "s0"): [row("run-b", "x", "s0")]}, META)
    before = read(con, tmp_path)
    files = len([f for f in table.table().file_uris() if "run_id=run-a" in f])  # type: ignore[union-attr]
    assert files == 6
    metrics = table.compact("run-a")
    assert metrics["numFilesRemoved"] == 6 and metrics["numFilesAdded"] == 1
    assert len([f for f in table.table().file_uris() if "run_id=run-a" in f]) == 1  # type: ignore[union-attr]
    assert read(con, tmp_path) == before
    assert len(before) == 19
    # compaction keeps the transaction identifiers: a redelivery after it still adds nothing
    assert table.write({("run-a", "s0"): [row("run-a", f"0-{j}", "s0") for j in range(3)]}, META) == 0
