"""Contracts kept once in libs/common: result columns and their types, worker liveness, run
ids. Each is read by more than one component; these tests pin what they all rely on."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalstream.aggregator import objects, store
from evalstream.common import fleet
from evalstream.common.jobs import RUN_ID, new_run_id
from evalstream.common.messages import Heartbeat
from evalstream.common.results import EXPORT_COLUMNS, RESULT_COLUMNS, RUN_ID_AT, arrow_schema, result_columns


def test_parquet_types_are_declared_not_inferred() -> None:
    # a shard whose items all failed has only nulls in `correct`: still a boolean column
    values = dict.fromkeys(RESULT_COLUMNS) | {"run_id": "r", "item_id": "a", "shard_id": "s"}
    rows = [tuple(values[c] for c in RESULT_COLUMNS)]
    table = pq.read_table(io.BytesIO(objects.rows_to_parquet(rows)))
    assert table.schema == arrow_schema(RESULT_COLUMNS)
    assert table.schema.field("correct").type == pa.bool_()
    assert table.schema.field("attempts").type == pa.int32()


def test_the_aggregator_writes_every_result_column_with_its_declared_type() -> None:
    assert objects.SCHEMA.names == list(RESULT_COLUMNS)
    assert (*RESULT_COLUMNS, "ordinal", "source") == store.STAGED_COLUMNS
    columns = ", ".join(store.STAGED_COLUMNS)
    # the staging table copies item_results' own column types, so COPY encodes each value
    # with the type declared there, not one inferred from the value
    assert store.CREATE_STAGING.endswith(f"SELECT {columns} FROM item_results WITH NO DATA")
    # every staged column, the ordinal made the run's by its block's base
    values = ", ".join(
        "staged.ordinal + block.base" if c == "ordinal" else f"staged.{c}" for c in store.STAGED_COLUMNS
    )
    for statement in (store.UPSERT_SUCCESS, store.INSERT_FAILURE):
        assert f"INSERT INTO item_results ({columns}) SELECT {values} FROM staged" in statement


def test_export_columns_are_result_columns() -> None:
    assert set(EXPORT_COLUMNS) <= set(RESULT_COLUMNS)
    assert arrow_schema(EXPORT_COLUMNS).names[:2] == ["item_id", "response"]


def beat(worker: str, ts: float, status: str = "ready") -> Heartbeat:
    return Heartbeat(worker_id=worker, group="g", model="null", device="cpu", ts=ts, status=status)  # type: ignore[arg-type]


def test_liveness_rule() -> None:
    now = 1000.0
    beats = [beat("a", now - 1), beat("b", now - 16), beat("c", now, "draining"), beat("d", now, "starting")]
    assert [hb.worker_id for hb in fleet.live_members(beats, now, 15.0)] == ["a", "d"]
    assert fleet.group_health(2, 3) == "degraded"
    assert fleet.group_health(3, 3) == "healthy"
    assert fleet.group_health(0, 3) == "dead"


def test_run_ids() -> None:
    ids = {new_run_id() for _ in range(200)}
    assert len(ids) == 200 and all(RUN_ID.fullmatch(i) for i in ids)


def test_result_rows_become_columns_in_result_column_order() -> None:
    rows = [tuple(f"{c}-{i}" for c in RESULT_COLUMNS) for i in range(3)]
    columns = result_columns(rows)
    assert len(columns) == len(RESULT_COLUMNS)
    assert columns[RUN_ID_AT] == ("run_id-0", "run_id-1", "run_id-2")
    assert columns[RESULT_COLUMNS.index("error")] == ("error-0", "error-1", "error-2")
    assert result_columns([]) == [() for _ in RESULT_COLUMNS]  # a table of no rows keeps its columns
    with pytest.raises(ValueError):  # a row of another width is refused, not read askew
        result_columns([rows[0][:-1], rows[1][:-1]])
    with pytest.raises(ValueError):  # rows of different widths (zip's strict check)
        result_columns([rows[0], rows[1][:-1]])
