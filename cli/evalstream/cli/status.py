"""`evalctl status RUN`: progress, throughput, failures and retries of a run."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from evalstream.cli.common import (
    database,
    out_json,
    run_row,
)
from evalstream.common.analysis import queries
from evalstream.common.settings import Settings


async def cmd_status(args: argparse.Namespace, settings: Settings) -> None:
    async with database(settings) as conn:
        run = await run_row(conn, args.run)
        agg = await queries.status_counts(conn, args.run)
        dead = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", args.run)
    start = run["published_at"] or run["created_at"]
    elapsed = ((agg["last"] if run["status"] == "completed" else None) or _now(start)) - start
    secs = max(elapsed.total_seconds(), 1e-9)
    status = {
        "run_id": args.run,
        "name": run["name"],
        "status": run["status"],
        "model": run["model"],
        "total": run["total"],
        "done": agg["done"],
        "failed": agg["failed"],
        "retried": agg["retried"],
        "cache_hits": agg["cache_hits"],
        "dead_letters": dead,
        "pending": (run["total"] - agg["done"]) if run["total"] is not None else None,
        "items_per_s": round(agg["done"] / secs, 3) if agg["done"] else 0.0,
        "elapsed_s": round(secs, 1),
        "problems": json.loads(run["problems"]) if run["problems"] else None,
    }
    if args.json:
        out_json(status)
        return
    for k, v in status.items():
        if v is not None:
            print(f"{k:>12}: {v}")


def _now(like: Any) -> Any:
    return datetime.now(like.tzinfo)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    st = sub.add_parser("status", help="progress, throughput, failures and retries of a run")
    st.add_argument("run")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=cmd_status)
