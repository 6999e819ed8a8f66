"""`evalctl dlq list RUN` / `evalctl dlq redrive RUN`: a run's dead letters."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import asyncpg

from evalstream.cli.common import database, fail, run_row
from evalstream.common import topics
from evalstream.common.jobs import publish_traced
from evalstream.common.messages import Redrive
from evalstream.common.settings import Settings

REDRIVE_WAIT_S = 120.0  # how long `dlq redrive` waits for the aggregator to act


async def cmd_dlq(args: argparse.Namespace, settings: Settings) -> None:
    async with database(settings) as conn:
        await run_row(conn, args.run)
        if args.dlq_cmd == "list":
            await list_dead_letters(conn, args.run)
        else:
            await request_redrive(conn, settings, args.run)


async def list_dead_letters(conn: asyncpg.Connection, run_id: str) -> None:
    rows = await conn.fetch(
        "SELECT id, item_id, original_topic, error, headers, created_at, redriven_at FROM dead_letters"
        " WHERE run_id = $1 ORDER BY id",
        run_id,
    )
    for r in rows:
        rec = {
            "id": r["id"],
            "item_id": r["item_id"],
            "original_topic": r["original_topic"],
            "error": r["error"],
            "attempts": json.loads(r["headers"]).get("x-attempts"),
            "created_at": r["created_at"],
            "redriven_at": r["redriven_at"],
        }
        print(json.dumps(rec, default=str))
    print(f"{len(rows)} dead letter(s)", file=sys.stderr)


async def request_redrive(conn: asyncpg.Connection, settings: Settings, run_id: str) -> None:
    """Asks the aggregator (messages.Redrive on eval.control) to put the run's dead letters
    back, then waits until every letter recorded before the request is marked redriven."""
    asked_at = await conn.fetchval("SELECT now()")
    pending = """SELECT count(*) FROM dead_letters
                 WHERE run_id = $1 AND redriven_at IS NULL AND created_at <= $2"""
    letters = await conn.fetchval(pending, run_id, asked_at)
    await publish_traced(settings, topics.CONTROL, Redrive(run_id=run_id), run_id)
    deadline = time.monotonic() + REDRIVE_WAIT_S
    while await conn.fetchval(pending, run_id, asked_at):
        if time.monotonic() > deadline:
            fail(f"the aggregator did not redrive {run_id} within {REDRIVE_WAIT_S:.0f}s (is it running?)")
        await asyncio.sleep(0.25)
    print(f"redrove {letters} dead letter(s) of {run_id}", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("dlq", help="dead letters of a run")
    dsub = d.add_subparsers(dest="dlq_cmd", required=True)
    for name, text in (
        ("list", "list the run's dead letters"),
        ("redrive", "put the run's dead letters back (the aggregator does it; this waits for it)"),
    ):
        p = dsub.add_parser(name, help=text)
        p.add_argument("run")
    d.set_defaults(handler=cmd_dlq)
