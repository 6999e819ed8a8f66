"""`evalctl regrade RUN --grader SPEC`: grade a finished run's stored answers again with
another grader, without any model call.

The result is a NEW run (its own run id), so that the original stays exactly as it was
and both can be compared (`evalctl compare RUN NEW`); its manifest is the original's with
the grader replaced and a `regrade_of` section naming the original run, its manifest hash
and grader. Each item keeps its response, latency, tokens, cache flag and served_by; only
`extracted`, `correct` and `score` are new. Items that failed in the original (no answer)
stay failed.

evalctl only asks (messages.Regrade on eval.control) and waits: the aggregator makes the
new run and sends the answers to a worker group, whose graders grade them (the code
sandbox, a `judge:` model allowed by that group's WORKER_MODEL, with the key its operator
mapped); the results are recorded like any run's. The group is the original run's
(`--worker-group` chooses another). The grader SPEC, and every answered item against it,
are checked here first, so that a bad grader is refused before anything is asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from evalstream.cli.common import EXIT_REJECTED, database, fail, out_json, print_report, run_row, wait_for_run
from evalstream.common import storage, topics
from evalstream.common.analysis import queries
from evalstream.common.gold import canonical_grader, item_problem
from evalstream.common.graders import grader_problem
from evalstream.common.jobs import new_run_id, publish_traced
from evalstream.common.manifest import request_from_manifest
from evalstream.common.messages import Regrade
from evalstream.common.regrading import StoredCopyError, run_items
from evalstream.common.settings import Settings

MAX_SHOWN = 20  # item problems listed when a grader is refused


async def check_items(settings: Settings, run: Any, grader: str) -> None:
    """Fails (before anything is asked) when an answered item cannot be graded by `grader`."""
    try:
        items = await asyncio.to_thread(
            run_items, storage.client(settings), request_from_manifest(json.loads(run["manifest"]))
        )
    except StoredCopyError as exc:
        fail(str(exc), EXIT_REJECTED)
    by_id = {i.id: i for i in items}
    async with database(settings) as conn:
        answered = await queries.answered_ids(conn, run["run_id"])
    problems = [p for r in answered if (i := by_id.get(r["item_id"])) and (p := item_problem(grader, i))]
    if problems:
        shown = "\n  ".join(problems[:MAX_SHOWN]) + (
            f"\n  ... and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
        )
        fail(
            f"cannot regrade {run['run_id']} with {grader}: {len(problems)} item(s)\n  {shown}", EXIT_REJECTED
        )


async def verdicts_changed(settings: Settings, run_id: str, new_id: str) -> tuple[int, int]:
    """(items whose verdict differs, answered items the new grader could not grade)."""
    async with database(settings) as conn:
        row = await queries.verdicts_changed(conn, run_id, new_id)
    return row["changed"], row["newly_failed"]


async def cmd_regrade(args: argparse.Namespace, settings: Settings) -> None:
    if problem := grader_problem(args.grader):
        fail(problem, EXIT_REJECTED)
    grader = args.grader if args.grader == "auto" else canonical_grader(args.grader)
    async with database(settings) as conn:
        run = await run_row(conn, args.run)
    if run["status"] != "completed" or run["manifest"] is None:
        fail(f"run {args.run} is {run['status']}: only a completed run can be regraded", EXIT_REJECTED)
    await check_items(settings, run, grader)
    new_id = new_run_id()
    request = Regrade(run_id=args.run, new_run_id=new_id, grader=grader, worker_group=args.worker_group)
    started = time.monotonic()
    await publish_traced(settings, topics.CONTROL, request, new_id)
    print(f"regrading {args.run} as {new_id} with {grader}", file=sys.stderr)
    summary = await wait_for_run(settings, new_id, timeout=args.timeout, quiet=args.json)
    changed, newly_failed = await verdicts_changed(settings, args.run, new_id)
    print(
        f"regraded {args.run} as {new_id} with {grader} in {time.monotonic() - started:.1f}s: "
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
    p.add_argument(
        "--worker-group",
        help="the worker group that grades (default: the original run's pinned group, else any serving its model)",
    )
    p.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    p.add_argument("--json", action="store_true", help="last stdout line: the new run's summary as JSON")
    p.set_defaults(handler=cmd_regrade)
