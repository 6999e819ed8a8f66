"""The aggregator's per-run counters are the run's rows by outcome: a success that replaces
a recorded failure (a redrive) moves the item from `failed` to `succeeded`, and a
redelivered result changes nothing. Real PostgreSQL, the aggregator's own store and
completion code, its metrics registry read as Prometheus would."""

from __future__ import annotations

import json

import asyncpg
import pytest
from prometheus_client import REGISTRY

from evalstream.aggregator import delta
from evalstream.aggregator.completion import Completion, written_results
from evalstream.aggregator.store import ResultStore
from evalstream.common import db, storage
from evalstream.common.messages import ItemResult
from evalstream.common.settings import Settings
from evalstream.common.testhooks import CrashPoints
from tests.support import unique

pytestmark = pytest.mark.stack


def result(run_id: str, item_id: str, error: str | None = None) -> ItemResult:
    return ItemResult(
        run_id=run_id, item_id=item_id, shard_id=f"{run_id}-s0", response=None if error else "4",
        extracted=None if error else "4", correct=None if error else True, score=0.0 if error else 1.0,
        error=error,
    )  # fmt: skip


def counted(run_id: str) -> dict[str, float | None]:
    return {
        status: REGISTRY.get_sample_value("evalstream_run_items_total", {"run_id": run_id, "status": status})
        for status in ("succeeded", "failed")
    }


async def test_a_redriven_success_moves_its_item_from_failed_to_succeeded(
    stack: Settings, pg: asyncpg.Connection
) -> None:
    run_id = unique("counters")
    await pg.execute(
        "INSERT INTO runs (run_id, status, model, grader, spec, total) VALUES ($1, 'running', 'null', 'exact', $2, 3)",
        run_id,
        json.dumps({}),
    )
    pool = await db.create_pool(stack.database_url)
    try:
        store = ResultStore(pool)
        table = delta.DeltaMirror(
            delta.DeltaResults(delta.table_uri(stack), delta.storage_options(stack)), store
        )
        completion = Completion(store, storage.client(stack), stack.s3_bucket_results, table, CrashPoints(""))

        async def record(results: list[ItemResult]) -> None:
            ok = [r for r in results if r.error is None]
            written = await store.write(ok, [r for r in results if r.error is not None])
            await completion.observe(written_results(results, written))

        await record([result(run_id, "a"), result(run_id, "b", "dead-lettered"), result(run_id, "c", "x")])
        assert counted(run_id) == {"succeeded": 1.0, "failed": 2.0}
        await record([result(run_id, "b")])  # the redrive's success replaces b's failure
        assert counted(run_id) == {"succeeded": 2.0, "failed": 1.0}
        await record([result(run_id, "b"), result(run_id, "c", "x")])  # redelivered: no new row
        assert counted(run_id) == {"succeeded": 2.0, "failed": 1.0}
        rows = await pg.fetch("SELECT error IS NULL AS ok FROM item_results WHERE run_id = $1", run_id)
        assert sorted(r["ok"] for r in rows) == [False, True, True]
        assert await pg.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) == 3
    finally:
        await pool.close()
        await pg.execute("DELETE FROM runs WHERE run_id = $1", run_id)
