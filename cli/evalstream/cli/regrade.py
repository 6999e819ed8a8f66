"""`evalctl regrade RUN --grader SPEC`: grade a finished run's stored answers again with
another grader, without any model call.

The result is a NEW run (its own run id), so that the original stays exactly as it was
and both can be compared (`evalctl compare RUN NEW`); its manifest is the original's with
the grader replaced and a `regrade_of` section naming the original run, its manifest hash
and grader. Each item keeps its response, latency, tokens, cache flag and served_by; only
`extracted`, `correct` and `score` are new. Items that failed in the original (no answer)
stay failed.

Grading happens here, in this process: the gold answers come from the run's stored
dataset copy in S3, a `code` grader needs bubblewrap, a `judge:` grader reaches its model
from here (with this environment's key variable). Nothing is published to Kafka. The
grader SPEC is checked, and every answered item against it, before anything is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg

from evalstream.cli.common import EXIT_REJECTED, database, fail, out_json, print_report, run_row
from evalstream.cli.datasets_cmd import read_items
from evalstream.cli.reproduce import request_from_manifest
from evalstream.common import storage
from evalstream.common.graders import grader_problem, grader_version
from evalstream.common.manifest import manifest_sha256
from evalstream.common.messages import Item
from evalstream.common.reports import summarise
from evalstream.common.results import RESULT_COLUMNS
from evalstream.common.settings import Settings

GRADING_THREADS = 8
GRADED_COLUMNS = ("extracted", "correct", "score", "error")  # what a regrade may change


def regraded_manifest(
    manifest: dict[str, Any], run_id: str, digest: str | None, grader: str
) -> dict[str, Any]:
    """The original manifest with the new grader and what it regrades (hashed: the grades
    depend on the original answers)."""
    out = json.loads(json.dumps(manifest))  # deep copy
    original_grader = out["grader"]["name"] if isinstance(out.get("grader"), dict) else out.get("grader")
    if isinstance(out.get("grader"), dict):  # manifest_version >= 2
        out["grader"] = {"name": grader, "version": grader_version(grader)}
    else:
        out["grader"] = grader
    out["regrade_of"] = {"run_id": run_id, "manifest_sha256": digest, "grader": original_grader}
    return out


def regrade_rows(
    rows: list[dict[str, Any]], items: dict[str, Item], grade: Callable[[str, Item], Any]
) -> list[dict[str, Any]]:
    """New result rows: answered items graded again, failed ones copied. A grader that
    fails on an item (a judge's model unreachable...) makes that item a failure here."""

    def one(row: dict[str, Any]) -> dict[str, Any]:
        if row["error"] is not None or row["response"] is None:
            return dict(row)
        try:
            g = grade(row["response"], items[row["item_id"]])
        except Exception as exc:
            return {
                **row,
                "extracted": None,
                "correct": None,
                "score": 0.0,
                "error": f"regrade: {type(exc).__name__}: {exc}",
            }
        return {**row, "extracted": g.extracted, "correct": g.correct, "score": g.score, "error": None}

    with ThreadPoolExecutor(GRADING_THREADS, thread_name_prefix="regrade") as pool:
        return list(pool.map(one, rows))


async def load_items(settings: Settings, manifest: dict[str, Any]) -> dict[str, Item]:
    """The run's items (gold answers, tests) from its content-addressed dataset copy,
    checked against the content hash its manifest recorded."""
    req = request_from_manifest(manifest)
    bucket, key = storage.parse_s3_uri(req.dataset_uri)
    try:
        data = await asyncio.to_thread(storage.get_bytes, storage.client(settings), bucket, key)
    except storage.S3Error as exc:
        fail(f"the run's dataset copy {req.dataset_uri} is not available ({exc.code})", EXIT_REJECTED)
    digest, items = await asyncio.to_thread(read_items, data, "items.jsonl")
    if digest != req.content_sha256:
        fail(f"the run's dataset copy {req.dataset_uri} changed since the run", EXIT_REJECTED)
    return {item.id: item for item in items}


async def write_run(
    conn: asyncpg.Connection, run: asyncpg.Record, new_run_id: str, grader: str, manifest: dict[str, Any],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """The new run, its results and its summary, in one transaction."""
    spec = {**json.loads(run["spec"]), "grader": grader, "run_id": new_run_id}
    spec["regrade_of"] = run["run_id"]
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO runs (run_id, name, status, model, grader, spec, manifest, manifest_sha256, dataset_uri,"
            " dataset_sha256, total, shard_count, recorded, published_at, completed_at)"
            " VALUES ($1, $2, 'completed', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, now(), now())",
            new_run_id,
            f"{run['name'] or run['run_id']} (regraded: {grader})",
            run["model"],
            grader,
            json.dumps(spec),
            json.dumps(manifest),
            manifest_sha256(manifest),
            run["dataset_uri"],
            run["dataset_sha256"],
            run["total"],
            run["shard_count"],
            len(rows),
        )
        if rows:
            columns = RESULT_COLUMNS  # the written ones: the table also has generated columns
            await conn.executemany(
                f"INSERT INTO item_results ({', '.join(columns)})"
                f" VALUES ({', '.join(f'${i + 1}' for i in range(len(columns)))})",
                [tuple(new_run_id if c == "run_id" else r[c] for c in columns) for r in rows],
            )
        summary = await summarise(conn, new_run_id)
        await conn.execute(
            "UPDATE runs SET summary = $2 WHERE run_id = $1", new_run_id, json.dumps(summary, default=str)
        )
    return summary


def mirror_to_s3(
    settings: Settings, run_id: str, rows: list[dict[str, Any]], summary: dict[str, Any]
) -> bool:
    """Parquet per shard and report.json, as the aggregator writes them for any run.
    False where the aggregator's writers are not installed (PostgreSQL has it all anyway)."""
    try:
        from evalstream.aggregator import objects
    except ImportError:
        return False
    s3 = storage.client(settings)
    by_shard: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_shard.setdefault(r["shard_id"], []).append({**r, "run_id": run_id})
    for shard_id, shard_rows in sorted(by_shard.items()):
        objects.write_shard(s3, settings.s3_bucket_results, run_id, shard_id, shard_rows)
    objects.write_report(s3, settings.s3_bucket_results, run_id, summary)
    return True


async def cmd_regrade(args: argparse.Namespace, settings: Settings) -> None:
    if problem := grader_problem(args.grader):
        fail(problem, EXIT_REJECTED)
    try:  # the graders are the worker's code: absent from the producer image
        from evalstream.worker.grading import canonical_grader, get_grader, item_problem
    except ImportError:
        fail("regrading needs the worker's graders: run it where the whole evalstream package is installed")
    grader = args.grader if args.grader == "auto" else canonical_grader(args.grader)
    async with database(settings) as conn:
        run = await run_row(conn, args.run)
        if run["status"] != "completed" or run["manifest"] is None:
            fail(f"run {args.run} is {run['status']}: only a completed run can be regraded", EXIT_REJECTED)
        manifest = json.loads(run["manifest"])
        items = await load_items(settings, manifest)
        rows = [
            dict(r)
            for r in await conn.fetch(
                "SELECT * FROM item_results WHERE run_id = $1 ORDER BY item_id", args.run
            )
        ]
        answered = [r for r in rows if r["error"] is None and r["response"] is not None]
        problems = [p for r in answered if (p := item_problem(grader, items[r["item_id"]]))]
        if problems:
            shown = "\n  ".join(problems[:20]) + (
                f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            )
            fail(
                f"cannot regrade {args.run} with {grader}: {len(problems)} item(s)\n  {shown}", EXIT_REJECTED
            )
        started = time.monotonic()
        new_rows = await asyncio.to_thread(regrade_rows, rows, items, get_grader(grader))
        seconds = time.monotonic() - started
        new_run_id = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        new_manifest = regraded_manifest(manifest, args.run, run["manifest_sha256"], grader)
        summary = await write_run(conn, run, new_run_id, grader, new_manifest, new_rows)
    if not await asyncio.to_thread(mirror_to_s3, settings, new_run_id, new_rows, summary):
        print("evalctl: warning: result files not written to S3 (no aggregator code here)", file=sys.stderr)
    changed = sum(a["correct"] != b["correct"] for a, b in zip(rows, new_rows, strict=True))
    newly_failed = sum(
        a["error"] is None and b["error"] is not None for a, b in zip(rows, new_rows, strict=True)
    )
    print(
        f"regraded {args.run} as {new_run_id} with {grader}: {len(answered)} answers in {seconds:.1f}s, "
        f"{changed} verdict(s) changed" + (f", {newly_failed} could not be graded" if newly_failed else ""),
        file=sys.stderr,
    )
    if args.json:
        out_json({**summary, "regrade_of": args.run, "changed": changed, "grading_failures": newly_failed})
    else:
        print_report(summary)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "regrade",
        help="grade a finished run's answers again with another grader (a new run; no model calls)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run")
    p.add_argument(
        "--grader",
        required=True,
        help="grader SPEC: exact, numeric, choice, regex[:PATTERN], contains, json[:FIELD.PATH], code, "
        "judge:MODEL_SPEC, auto",
    )
    p.add_argument("--json", action="store_true", help="last stdout line: the new run's summary as JSON")
    p.set_defaults(handler=cmd_regrade)
