"""What a fault scenario's runs left behind, read from wherever it landed: the stack's
processes (their pid files), PostgreSQL, Kafka (eval.results, the dead letters, the work
topic), the aggregators' /metrics and S3 (the results' Parquet, the reports). A `Scenario`
(tests/faults/scenario.py) gathers it for the checker (checker.py)."""

from __future__ import annotations

import io
import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from evalstream.common import storage, topics
from evalstream.common.lag import topic_partitions
from evalstream.common.messages import Shard, ShardResult, decode
from evalstream.common.settings import SERVICE_PORTS, Settings
from tests.faults.checker import LogRecord, Outcome
from tests.support import STACK, admin_database_url, admin_kafka

PORT_OFFSET = int(os.environ.get("EVALSTREAM_PORT_OFFSET", "0"))
REPLICA_PORT_BASE = 8130  # aggregator-1, -2, ... (ops/local/localstack/prometheus.py)


# --------------------------------------------------------------------------- the stack


def stack_pid(name: str) -> int:
    if name == "postgres":
        return int((STACK / "postgres" / "postmaster.pid").read_text().splitlines()[0])
    return int((STACK / "run" / f"{name}.pid").read_text())


def alive_pid(name: str) -> int | None:
    """The process's pid while it runs; None once it is gone or a zombie (a process that
    died after `stack.py up` returned is nobody's child to reap)."""
    try:
        pid = stack_pid(name)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state == "Z" else pid


# --------------------------------------------------------------------------- database reads


async def _fetchval(settings: Settings, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def count_rows(settings: Settings, run_id: str) -> int:
    return int(await _fetchval(settings, "SELECT count(*) FROM item_results WHERE run_id = $1", run_id))


async def run_status(settings: Settings, run_id: str) -> str | None:
    status: str | None = await _fetchval(settings, "SELECT status FROM runs WHERE run_id = $1", run_id)
    return status


async def rows_by_run(settings: Settings, run_ids: list[str]) -> dict[str, tuple[int, int, float]]:
    """(succeeded rows, failed rows, score sum) of each run, now."""
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, count(*) FILTER (WHERE error IS NULL) AS ok, count(*) FILTER (WHERE error IS NOT NULL)"
            " AS bad, coalesce(sum(score), 0) AS score FROM item_results WHERE run_id = ANY($1::text[]) GROUP BY run_id",
            run_ids,
        )
    finally:
        await conn.close()
    out = {r: (0, 0, 0.0) for r in run_ids}
    out.update({r["run_id"]: (int(r["ok"]), int(r["bad"]), float(r["score"])) for r in rows})
    return out


# --------------------------------------------------------------------------- Kafka reads


@dataclass(frozen=True)
class TimedRecord:
    record: LogRecord
    run_id: str
    timestamp: float  # unix seconds (the record's create time)


async def committed_offsets(work_topic: str) -> dict[int, int]:
    """The offsets a worker group has committed on its work topic (0 where none yet)."""
    group = topics.worker_consumer_group(work_topic.removeprefix(topics.WORK_PREFIX))
    consumer = AIOKafkaConsumer(**admin_kafka(), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        out = {}
        for p in await _partitions(consumer, work_topic):
            out[p] = await consumer.committed(TopicPartition(work_topic, p)) or 0
        return out
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    return sorted(tp.partition for tp in await topic_partitions(consumer, topic))


def result_records(records: list[Any], run_ids: set[str]) -> list[TimedRecord]:
    out = []
    for r in records:
        try:
            result = decode(r.value or b"", ShardResult)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if result.run_id in run_ids:
            ids = tuple(x.item_id for x in result.results)
            out.append(
                TimedRecord(LogRecord(r.topic, r.partition, r.offset, ids), result.run_id, r.timestamp / 1000)
            )
    return out


def shard_records(records: list[Any], run_ids: set[str]) -> list[TimedRecord]:
    out = []
    for r in records:
        try:
            shard = decode(r.value or b"", Shard)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if shard.run_id in run_ids:
            ids = tuple(i.id for i in shard.items)
            out.append(
                TimedRecord(LogRecord(r.topic, r.partition, r.offset, ids), shard.run_id, r.timestamp / 1000)
            )
    return out


# --------------------------------------------------------------------------- the aggregator's counters


def aggregators() -> dict[str, int]:
    """The aggregator processes running now: name -> pid (`aggregator`, `aggregator-1`, ...)."""
    names = ["aggregator", *sorted(p.stem for p in (STACK / "run").glob("aggregator-*.pid"))]
    return {n: pid for n in names if (pid := alive_pid(n)) is not None}


def aggregator_port(name: str) -> int:
    index = name.removeprefix("aggregator").removeprefix("-")
    base = SERVICE_PORTS["aggregator"] if not index else REPLICA_PORT_BASE + int(index)
    return base + PORT_OFFSET


def aggregator_counters(run_ids: set[str], names: list[str]) -> dict[str, tuple[float, float, float]]:
    """The per-run counters (succeeded, failed, score) summed over the aggregators `names`,
    from their /metrics: each counts the rows it wrote itself."""
    out = {run_id: [0.0, 0.0, 0.0] for run_id in run_ids}
    for name in names:
        with urllib.request.urlopen(f"http://127.0.0.1:{aggregator_port(name)}/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                run_id = s.labels.get("run_id")
                if run_id not in out:
                    continue
                if s.name == "evalstream_run_items_total":
                    out[run_id][0 if s.labels.get("status") == "succeeded" else 1] += s.value
                elif s.name == "evalstream_run_score_total":
                    out[run_id][2] += s.value
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


# --------------------------------------------------------------------------- what the checker reads of each run


async def row_outcomes(settings: Settings, run_ids: list[str]) -> dict[str, list[Outcome]]:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, item_id, error, score FROM item_results WHERE run_id = ANY($1::text[])", run_ids
        )
    finally:
        await conn.close()
    out: dict[str, list[Outcome]] = {}
    for r in rows:
        out.setdefault(r["run_id"], []).append(
            Outcome(r["item_id"], r["error"] is not None, float(r["score"]))
        )
    return out


async def recorded_since(
    settings: Settings, run_ids: list[str], since: float
) -> list[tuple[str, str, float]]:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, item_id, extract(epoch FROM recorded_at)::float8 AS t FROM item_results"
            " WHERE run_id = ANY($1::text[]) AND recorded_at >= to_timestamp($2)",
            run_ids,
            since,
        )
    finally:
        await conn.close()
    return [(r["run_id"], r["item_id"], r["t"]) for r in rows]


async def run_rows(settings: Settings, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, status, total, recorded, shard_count, summary FROM runs WHERE run_id = ANY($1::text[])",
            run_ids,
        )
    finally:
        await conn.close()
    return {
        r["run_id"]: {**dict(r), "summary": json.loads(r["summary"]) if r["summary"] else None} for r in rows
    }


async def cache_entries_since(settings: Settings, since: float) -> int:
    return int(
        await _fetchval(
            settings,
            "SELECT count(*) FROM answer_cache WHERE model = 'null' AND created_at >= to_timestamp($1)",
            since,
        )
    )


def parquet_outcomes(settings: Settings, run_ids: list[str]) -> dict[str, list[Outcome]]:
    s3 = storage.client(settings)
    out: dict[str, list[Outcome]] = {}
    for run_id in run_ids:
        got = out.setdefault(run_id, [])
        for obj in s3.list_objects(
            settings.s3_bucket_results, prefix=f"runs/{run_id}/results/", recursive=True
        ):
            table = pq.read_table(
                io.BytesIO(storage.get_bytes(s3, settings.s3_bucket_results, obj.object_name))
            )
            for item_id, error, score in zip(
                table.column("item_id").to_pylist(),
                table.column("error").to_pylist(),
                table.column("score").to_pylist(),
                strict=True,
            ):
                got.append(Outcome(item_id, error is not None, float(score or 0.0)))
    return out


def stored_reports(settings: Settings, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    s3 = storage.client(settings)
    out = {}
    for run_id in run_ids:
        try:
            out[run_id] = json.loads(
                storage.get_bytes(s3, settings.s3_bucket_results, f"runs/{run_id}/report.json")
            )
        except Exception as exc:  # missing or unreadable: kept, for the checker to flag
            out[run_id] = {"unreadable": f"{type(exc).__name__}: {exc}"[:300]}
    return out
