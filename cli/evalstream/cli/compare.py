"""`evalctl compare RUN_A RUN_B`: per-item differences between two runs on the same items,
and whether the accuracy difference is more than noise.

Both tests are paired (the same items, answered twice), which is far more sensitive than
comparing two accuracies as if they were independent samples:

* the exact McNemar test on the discordant pairs (items right in one run only): under
  "no difference" each is equally likely to favour either run, so the two-sided p-value is
  a binomial tail, computed exactly with integers;
* a paired bootstrap confidence interval for the accuracy delta (items resampled with
  replacement, fixed seed so that the same two runs always give the same interval).

A failed item counts as wrong (score 0), as in the run's own accuracy.
"""

# The statistics and the comparison: evalstream.common.analysis.paired.

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import asyncpg

from evalstream.cli.common import database, out_json, run_row
from evalstream.common.analysis import compare_html, items
from evalstream.common.analysis.compare import load_results
from evalstream.common.analysis.paired import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, compare_results
from evalstream.common.settings import Settings

SHOWN = 10  # item ids printed per list (--json has them all)


def _ids(ids: list[str]) -> str:
    more = f" ... (+{len(ids) - SHOWN})" if len(ids) > SHOWN else ""
    return ", ".join(ids[:SHOWN]) + more


def print_comparison(c: dict[str, Any], label_a: str, label_b: str) -> None:
    items, acc, mc = c["items"], c["accuracy"], c["mcnemar"]
    print(f"A = {label_a}\nB = {label_b}")
    print(f"  items: A {items['a']}, B {items['b']}, both {items['common']}")
    for key, text in (("only_in_a", "only in A"), ("only_in_b", "only in B")):
        if items[key]:
            print(f"    {text} ({len(items[key])}): {_ids(items[key])}")
    print(f"  identical responses: {c['identical_responses']}/{items['common']}")
    for key, text in (
        ("answer_changed", "response changed"),
        ("extracted_changed", "extracted answer changed"),
    ):
        if c[key]:
            print(f"    {text} ({len(c[key])}): {_ids(c[key])}")
    for key, text in (("right_in_a_only", "right in A only"), ("right_in_b_only", "right in B only")):
        ids = c["flips"][key]
        if ids:
            print(f"    {text} ({len(ids)}): {_ids(ids)}")
    if acc["a"] is None:
        print("  no items in common: nothing to compare")
        return
    lo, hi = acc["ci"]
    print(
        f"  accuracy on common items: A {acc['a']:.1%}  B {acc['b']:.1%}  delta {acc['delta']:+.1%}"
        f"  ({acc['confidence']:.0%} paired bootstrap CI {lo:+.1%} .. {hi:+.1%})"
    )
    print(
        f"  McNemar exact: {mc['right_in_a_only']} vs {mc['right_in_b_only']} discordant, p = {mc['p_value']:.4g}"
    )


async def cmd_compare(args: argparse.Namespace, settings: Settings) -> None:
    async with database(settings) as conn:
        runs = [await run_row(conn, r) for r in (args.run_a, args.run_b)]
        results = [await load_results(conn, r) for r in (args.run_a, args.run_b)]
        comparison = compare_results(*results, resamples=args.resamples, seed=args.seed)
        comparison = {"run_a": args.run_a, "run_b": args.run_b, **comparison}
        labels = [f"{r['run_id']} ({r['model']}, {r['status']})" for r in runs]
        if args.html:
            await write_html(conn, comparison, labels, Path(args.html))
    if args.json:
        out_json(comparison)
        return
    print_comparison(comparison, *labels)


async def write_html(
    conn: asyncpg.Connection, comparison: dict[str, Any], labels: list[str], path: Path
) -> None:
    """The compare page as a file: these figures, then the flipped items with both answers."""
    page = await items.compare_page(
        conn, comparison["run_a"], comparison["run_b"], limit=items.MAX_FILE_ROWS, stats=comparison
    )
    flips = comparison["mcnemar"]["right_in_a_only"] + comparison["mcnemar"]["right_in_b_only"]
    note = f"the first {len(page.rows)} of {flips} flipped items" if page.next_after else ""
    path.write_text(compare_html.compare_document(page, labels, live=False, note=note), encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="per-item differences of two runs, accuracy delta with paired tests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--resamples", type=int, default=BOOTSTRAP_RESAMPLES, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=BOOTSTRAP_SEED, help="bootstrap seed")
    p.add_argument("--json", action="store_true", help="the comparison as one JSON line")
    p.add_argument(
        "--html", metavar="FILE", help="also write the two runs side by side, flipped items first, as HTML"
    )
    p.set_defaults(handler=cmd_compare)
