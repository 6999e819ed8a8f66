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

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from evalstream.cli.common import database, out_json, run_row
from evalstream.common import items, items_html
from evalstream.common.paired import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    mcnemar_exact,
    paired_bootstrap_ci,
)
from evalstream.common.settings import Settings

__all__ = ["compare_results", "load_results", "mcnemar_exact", "paired_bootstrap_ci"]

SHOWN = 10  # item ids printed per list (--json has them all)

Result = Mapping[str, Any]  # a row of item_results: item_id, response, extracted, correct, score, error


def _right(r: Result) -> bool:
    return r.get("error") is None and bool(r.get("correct"))


def _score(r: Result) -> float:
    return 0.0 if r.get("error") is not None else float(r.get("score") or 0.0)


def compare_results(
    a: Sequence[Result],
    b: Sequence[Result],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """Per-item differences and the paired statistics over the items both runs have."""
    by_a = {str(r["item_id"]): r for r in a}
    by_b = {str(r["item_id"]): r for r in b}
    common = sorted(by_a.keys() & by_b.keys())
    pairs = [(by_a[i], by_b[i]) for i in common]
    answer_changed = [
        i for i, (x, y) in zip(common, pairs, strict=True) if x.get("response") != y.get("response")
    ]
    extracted_changed = [
        i for i, (x, y) in zip(common, pairs, strict=True) if x.get("extracted") != y.get("extracted")
    ]
    a_only = [i for i, (x, y) in zip(common, pairs, strict=True) if _right(x) and not _right(y)]
    b_only = [i for i, (x, y) in zip(common, pairs, strict=True) if _right(y) and not _right(x)]
    score_changed = [i for i, (x, y) in zip(common, pairs, strict=True) if _score(x) != _score(y)]
    a_scores = [_score(x) for x, _ in pairs]
    b_scores = [_score(y) for _, y in pairs]
    acc_a = math.fsum(a_scores) / len(common) if common else None
    acc_b = math.fsum(b_scores) / len(common) if common else None
    ci = paired_bootstrap_ci(a_scores, b_scores, resamples=resamples, seed=seed)
    return {
        "items": {
            "a": len(by_a),
            "b": len(by_b),
            "common": len(common),
            "only_in_a": sorted(by_a.keys() - by_b.keys()),
            "only_in_b": sorted(by_b.keys() - by_a.keys()),
        },
        "identical_responses": len(common) - len(answer_changed),
        "answer_changed": answer_changed,
        "extracted_changed": extracted_changed,
        "score_changed": score_changed,
        "flips": {"right_in_a_only": a_only, "right_in_b_only": b_only},
        "accuracy": {
            "a": _round(acc_a),
            "b": _round(acc_b),
            "delta": _round(acc_b - acc_a) if acc_a is not None and acc_b is not None else None,
            "ci": list(ci) if ci else None,
            "confidence": CONFIDENCE,
            "bootstrap": {"resamples": resamples, "seed": seed},
        },
        "mcnemar": {
            "right_in_a_only": len(a_only),
            "right_in_b_only": len(b_only),
            "p_value": round(mcnemar_exact(len(a_only), len(b_only)), 6),
        },
    }


def _round(x: float | None) -> float | None:
    return round(x, 6) if x is not None else None


# --------------------------------------------------------------------------- output


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


# --------------------------------------------------------------------------- command


async def load_results(conn: asyncpg.Connection, run_id: str) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT item_id, response, extracted, correct, score, error, cache_hit, served_by, model_revision"
        " FROM item_results WHERE run_id = $1 ORDER BY item_id",
        run_id,
    )
    return [dict(r) for r in rows]


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
    path.write_text(items_html.compare_document(page, labels, live=False, note=note), encoding="utf-8")
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
