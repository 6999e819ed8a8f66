"""`evalctl report RUN`: the run summary, as text, JSON or an HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evalstream.cli.common import (
    EXIT_REJECTED,
    add_cut_arguments,
    database,
    fail,
    out_json,
    print_report,
    run_row,
)
from evalstream.common.analysis import report_html
from evalstream.common.analysis.audit_runs import accuracy_without_flagged
from evalstream.common.analysis.reports import summarise
from evalstream.common.analysis.versions import DatasetRefError
from evalstream.common.settings import Settings


async def cmd_report(args: argparse.Namespace, settings: Settings) -> None:
    async with database(settings) as conn:
        await run_row(conn, args.run)
        summary = await summarise(conn, args.run)
        if args.exclude_flagged:
            try:
                summary["label_audit"] = await accuracy_without_flagged(
                    conn, settings, args.run, threshold=args.threshold, max_fdr=args.fdr
                )
            except (DatasetRefError, LookupError) as exc:
                fail(f"cannot audit the run's dataset: {exc}", EXIT_REJECTED)
        page = report_html.render(await report_html.collect(conn, args.run, summary)) if args.html else None
    if args.html and page is not None:
        Path(args.html).write_text(page, encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        out_json(summary)
    elif not args.html:
        print_report(summary)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rep = sub.add_parser("report", help="the run summary")
    rep.add_argument("run")
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--html", metavar="FILE", help="also write an HTML report")
    rep.add_argument(
        "--exclude-flagged",
        action="store_true",
        help="also the accuracy without the items whose gold `evalctl audit` flags (every completed run "
        "on the run's dataset version votes), beside the raw figure",
    )
    add_cut_arguments(rep)  # with --exclude-flagged: where the audit cuts
    rep.set_defaults(handler=cmd_report)
