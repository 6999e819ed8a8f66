"""`evalctl results RUN`: one record per item (EXPORT_COLUMNS), as JSON lines or Parquet."""

from __future__ import annotations

import argparse
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from evalstream.cli.common import (
    database,
    fail,
    run_row,
)
from evalstream.common.analysis import queries
from evalstream.common.results import EXPORT_COLUMNS, arrow_schema
from evalstream.common.settings import Settings


async def cmd_results(args: argparse.Namespace, settings: Settings) -> None:
    async with database(settings) as conn:
        await run_row(conn, args.run)
        rows = await queries.results(conn, args.run, EXPORT_COLUMNS)
    records = [dict(r) for r in rows]
    if args.format == "parquet":
        if not args.output:
            fail("--format parquet needs -o FILE")
        pq.write_table(pa.Table.from_pylist(records, schema=arrow_schema(EXPORT_COLUMNS)), args.output)
        print(f"wrote {len(records)} results to {args.output}", file=sys.stderr)
        return
    stream = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115
    try:
        for r in records:
            stream.write(json.dumps(r, default=str) + "\n")
    finally:
        if args.output:
            stream.close()
            print(f"wrote {len(records)} results to {args.output}", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("results", help="one record per item")
    r.add_argument("run")
    r.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    r.add_argument("-o", "--output", help="write to FILE instead of stdout")
    r.set_defaults(handler=cmd_results)
