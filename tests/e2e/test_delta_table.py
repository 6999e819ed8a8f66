"""The Delta Lake table of results, read back with DuckDB exactly as the README's query
does, equals the PostgreSQL rows of a run after an aggregator kill -9 between its Delta
commit and its Kafka commit, a redelivered shard, and a redrive whose successes replace the
recorded failures."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from deltalake import DeltaTable

from evalstream.aggregator import delta
from evalstream.common import topics
from evalstream.common.messages import JobSpec, ShardResult, decode, encode
from evalstream.common.results import RESULT_COLUMNS
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import arithmetic_items, evalctl, result_rows, run_status, write_jsonl
from tests.support import (
    STACK,
    admin_kafka,
    admin_settings,
    duckdb_delta,
    read_topic_since,
    stack_cmd,
    topic_end_offsets,
    unique,
    upload_dataset,
    wait_until,
)

pytestmark = pytest.mark.stack

README_QUERY = "SELECT * FROM delta_scan('s3://{bucket}/tables/item_results') WHERE run_id = ?"
COLUMNS = [*RESULT_COLUMNS, *delta.RUN_COLUMNS]


def delta_rows(settings: Settings, run_id: str) -> list[tuple[Any, ...]]:
    con = duckdb_delta(settings)
    query = README_QUERY.format(bucket=settings.s3_bucket_results).replace(
        "SELECT *", f"SELECT {', '.join(COLUMNS)}"
    )
    return [tuple(r) for r in con.execute(query + " ORDER BY item_id", [run_id]).fetchall()]


async def pg_rows(pg: asyncpg.Connection, run_id: str) -> list[tuple[Any, ...]]:
    rows = await pg.fetch(
        f"SELECT {', '.join(f'i.{c}' for c in RESULT_COLUMNS)}, r.model, r.manifest_sha256, r.dataset_sha256"
        " FROM item_results i JOIN runs r USING (run_id) WHERE run_id = $1 ORDER BY item_id",
        run_id,
    )
    return [tuple(r) for r in rows]


def table(settings: Settings) -> DeltaTable:
    return DeltaTable(delta.table_uri(settings), storage_options=delta.storage_options(settings))


async def consumed(settings: Settings, partition: int, offset: int) -> bool:
    """Whether the aggregator has committed past `offset` of eval.results' `partition`."""
    admin = AIOKafkaAdminClient(**admin_kafka())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(topics.AGGREGATOR_GROUP)
    finally:
        await admin.close()
    return any(
        tp.topic == topics.RESULTS and tp.partition == partition and m.offset > offset
        for tp, m in offsets.items()
    )


async def test_delta_table_equals_postgres_after_kill_redelivery_and_redrive(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path, kafka_producer: AIOKafkaProducer, spawn
) -> None:
    group = unique("delta")
    await ensure_topics(admin_settings(), [group])
    flaky, port = spawn(
        "evalstream.worker",
        WORKER_GROUP=group,
        WORKER_MODEL="null",
        ENGINE_FAULTS="transient=0,permanent=0.2,seed=7",
    )
    await asyncio.to_thread(flaky.wait_healthy, port)

    # 1) the aggregator dies (kill -9 semantics: os._exit) right after its second Delta
    #    commit, before the Kafka commit: that batch is redelivered to its successor
    stack_cmd("stop", "aggregator")
    log = STACK / "logs" / "aggregator.log"
    log_from = log.stat().st_size if log.exists() else 0
    # It may die before it reports healthy: what follows proves that it died at its point.
    with contextlib.suppress(subprocess.CalledProcessError):
        stack_cmd("up", env={"FAULT_INJECT": "aggregator_exit_after_delta=2"})
    started = int((STACK / "run" / "aggregator.pid").read_text())  # it was started (else: raises)
    run_id = unique("run-delta")
    job = JobSpec(
        dataset=upload_dataset(stack, write_jsonl(tmp_path / "d.jsonl", arithmetic_items(60, prefix="d"))),
        model="null",
        run_id=run_id,
        worker_group=group,
        shard_size=10,
    )
    results_start = await topic_end_offsets(topics.RESULTS)
    await kafka_producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())

    async def died_at_its_crash_point() -> bool:
        """The process started with the crash point is gone, and it said it exited there
        (a process that never started, or died of something else, does not pass)."""
        said = "fault injection: exiting at aggregator_exit_after_delta #2" in log.read_bytes()[
            log_from:
        ].decode(errors="replace")
        try:
            os.kill(started, 0)
            return False
        except ProcessLookupError:
            return said

    await wait_until(died_at_its_crash_point, 120, what="the aggregator to die at its crash point")
    stack_cmd("up")  # back, without the crash point

    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, 180, what="the run to complete")
    failed = {r["item_id"] for r in await result_rows(pg, run_id) if r["error"]}
    assert failed, "the flaky group failed no item: nothing to redrive"
    assert delta_rows(stack, run_id) == await pg_rows(pg, run_id)
    history = table(stack).history()
    assert any(h["operation"] == "OPTIMIZE" for h in history), "no compaction when the run completed"

    # 2) a shard's results delivered again: the table does not change at all
    version = table(stack).version()
    ours = [
        (k, v) for k, v, _ in await read_topic_since(topics.RESULTS, results_start) if run_id.encode() in v
    ]
    assert ours
    dup = await kafka_producer.send_and_wait(topics.RESULTS, ours[0][1], key=ours[0][0])
    await wait_until(
        lambda: consumed(stack, dup.partition, dup.offset), 60, what="the aggregator to take the duplicate"
    )
    assert decode(ours[0][1], ShardResult).run_id == run_id
    assert table(stack).version() == version
    assert delta_rows(stack, run_id) == await pg_rows(pg, run_id)

    # 3) the failures redriven to a healthy group: their successes replace them in the table
    flaky.stop()
    healthy, port2 = spawn("evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="null")
    await asyncio.to_thread(healthy.wait_healthy, port2)
    evalctl("dlq", "redrive", run_id)

    async def all_succeeded() -> bool:
        rows = await result_rows(pg, run_id)
        return len(rows) == 60 and all(r["error"] is None for r in rows)

    await wait_until(all_succeeded, 120, what="the redriven items to succeed")

    async def delta_caught_up() -> bool:
        return delta_rows(stack, run_id) == await pg_rows(pg, run_id)

    await wait_until(delta_caught_up, 60, what="the Delta table to hold the redriven successes")
    rows = delta_rows(stack, run_id)
    assert len(rows) == 60 and len({r[1] for r in rows}) == 60
    assert all(r[COLUMNS.index("error")] is None for r in rows)
    run = await pg.fetchrow(
        "SELECT model, manifest_sha256, dataset_sha256 FROM runs WHERE run_id = $1", run_id
    )
    assert {tuple(r[-3:]) for r in rows} == {(run["model"], run["manifest_sha256"], run["dataset_sha256"])}
    assert run["manifest_sha256"] and run["dataset_sha256"]
    # partitioned by run: every file of this run sits in its own partition
    files = [f for f in table(stack).file_uris() if f"run_id={run_id}/" in f]
    assert files and all(f"/run_id={run_id}/" in f for f in files)
    print(json.dumps({"delta_version": table(stack).version(), "run_files": len(files)}))
