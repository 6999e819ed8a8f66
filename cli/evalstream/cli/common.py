"""What every evalctl command shares: exit codes and failing, JSON output, reading a run, waiting
for one with a progress bar, printing a summary, reading the fleet's heartbeats, and the
label audit's cut arguments (audit, report --exclude-flagged)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec
from aiokafka import AIOKafkaConsumer

from evalstream.cli.progress import ProgressBar
from evalstream.common import topics
from evalstream.common.analysis import queries
from evalstream.common.analysis.audit import MAX_FDR
from evalstream.common.analysis.reports import score_rows, summarise
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.lag import topic_partitions
from evalstream.common.messages import Heartbeat, decode
from evalstream.common.settings import KafkaSettings, Settings


def probability(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a probability between 0 and 1")
    return value


def add_cut_arguments(p: argparse.ArgumentParser) -> None:
    """--fdr and --threshold: where the reliability audit cuts (audit, report --exclude-flagged)."""
    p.add_argument(
        "--fdr",
        type=probability,
        default=MAX_FDR,
        help="reliability: flag the most items whose estimated share of false alarms stays at or "
        f"under this rate (default {MAX_FDR})",
    )
    p.add_argument(
        "--threshold",
        type=probability,
        help="reliability: instead of --fdr, flag every item whose gold is wrong with at least this probability",
    )


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the results database, for the length of one command."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        yield conn
    finally:
        await conn.close()


EXIT_REJECTED = 2  # the input (dataset, job, grader, run state) was refused
EXIT_FAILED = 1


def fail(message: str, code: int = EXIT_FAILED) -> None:
    print(f"evalctl: {message}", file=sys.stderr)
    raise SystemExit(code)


def out_json(value: Any) -> None:
    print(json.dumps(value, default=str, sort_keys=True))


async def run_row(conn: asyncpg.Connection, run_id: str) -> asyncpg.Record:
    row = await queries.run(conn, run_id)
    if row is None:
        fail(f"no run {run_id!r}")
    return row


async def wait_for_run(
    settings: Settings, run_id: str, *, timeout: float | None, quiet: bool
) -> dict[str, Any]:
    bar = ProgressBar(run_id)
    deadline = time.monotonic() + timeout if timeout else None
    async with database(settings) as conn:
        while True:
            row = await queries.progress(conn, run_id)  # no count over the run's rows
            if row is not None and row["status"] == "rejected":
                bar.close()
                problems = json.loads(row["problems"] or "[]")
                lines = "\n  ".join(problem_text(p) for p in problems[:30])
                fail(
                    f"run {run_id} rejected: {len(problems)} problem(s)\n  {lines}",
                    EXIT_REJECTED,
                )
            if row is not None and row["status"] == "completed":
                bar.update(row["done"], row["total"], f"failed {row['failed']}")
                bar.close()
                return await summarise(conn, run_id)
            status = row["status"] if row else "queued"
            bar.update(
                row["done"] if row else 0,
                row["total"] if row else None,
                f"{status}, failed {row['failed']}" if row else "waiting for the producer",
            )
            if deadline and time.monotonic() > deadline:
                bar.close()
                fail(
                    f"run {run_id} did not finish within {timeout:.0f}s (it goes on; see `evalctl status {run_id}`)"
                )
            await asyncio.sleep(0.5)


def problem_text(p: dict[str, Any]) -> str:
    where = f"{p.get('unit', 'line')} {p['line']}: " if p.get("line") else ""
    field = f"{p['field']}: " if p.get("field") and not where else ""
    return f"{where}{field}{p.get('message', p)}"


def print_report(s: dict[str, Any]) -> None:
    acc = f"{s['accuracy']:.1%}" if s["accuracy"] is not None else "n/a"
    lat = s["latency_ms"]
    print(f"run {s['run_id']} ({s['name']}): {s['status']}")
    print(f"  model {s['model']}   grader {s['grader']}")
    print(
        f"  items {s['total']}: {s['succeeded']} answered, {s['failed']} failed, {s['cache_hits']} from cache"
    )
    print(
        f"  accuracy {acc}"
        + (f" (answered only: {s['accuracy_answered']:.1%})" if s["accuracy_answered"] is not None else "")
    )
    if lat["p50"] is not None:
        print(
            f"  latency ms p50 {lat['p50']:.0f}  p95 {lat['p95']:.0f}  p99 {lat['p99']:.0f}   "
            f"throughput {s['items_per_s']} items/s"
        )
    if rows := score_rows(s.get("scores")):
        print(f"  lm-eval scores ({s['scores']['grader']}):")
        for name, value in rows:
            print(f"    {name:<32} {value}")
    for title, key in (("category", "by_category"), ("served by", "by_served_by")):
        if s[key]:
            print(f"  by {title}:")
            for name, b in s[key].items():
                print(
                    f"    {name:<32} {b['total']:>6} items  accuracy {b['accuracy']:.1%}  failed {b['failed']}"
                )
    if audit := s.get("label_audit"):
        clean = audit["accuracy_excluding_flagged"]
        print(
            f"  accuracy without the {audit['flagged']} item(s) whose gold the audit flags: "
            + (f"{clean:.1%}" if clean is not None else "n/a")
            + f" (raw {acc}; {len(audit['models'])} model(s) on this dataset version, "
            + (
                f"threshold {audit['threshold']})"
                if audit["threshold"] is not None
                else f"false-alarm rate <= {audit['max_fdr']})"
            )
        )
        for kind, why in audit["skipped"].items():
            print(f"    audit skipped {kind}: {why}")
    print(f"  dataset {s['dataset_sha256']}  manifest {s['manifest_sha256']}")


async def read_heartbeats(settings: KafkaSettings) -> list[Heartbeat]:
    consumer = AIOKafkaConsumer(
        **client_kwargs(settings), enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    latest: dict[str, Heartbeat] = {}
    try:
        tps = await topic_partitions(consumer, topics.HEARTBEATS)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                for rec in records:
                    if rec.value:
                        try:
                            hb = decode(rec.value, Heartbeat)
                            latest[hb.worker_id] = hb
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            pass
                    elif rec.key:
                        latest.pop(rec.key.decode(errors="replace"), None)  # any bytes may be a key
    finally:
        await consumer.stop()
    return list(latest.values())
