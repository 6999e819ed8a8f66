"""HTML of two runs side by side: the paired figures (evalstream.common.analysis.paired,
aggregated in SQL by items.compare_stats), then the items, flipped ones first. Served by the
aggregator at /compare/<run_a>/<run_b>; written to a file by `evalctl compare --html`.
Model output is hostile text (pages.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evalstream.common.analysis import pages
from evalstream.common.analysis.items import OUTCOME_NAMES, ComparePage
from evalstream.common.analysis.pages import clip_cell, escape, pct, q

_RANK_NAMES = {0: "right in A only", 1: "right in B only", 2: "answer changed", 3: "same answer"}


def compare_stats_table(stats: Mapping[str, Any]) -> str:
    acc, mc, items = stats["accuracy"], stats["mcnemar"], stats["items"]
    ci = acc.get("ci")
    ci_text = f"{ci[0]:+.1%} .. {ci[1]:+.1%}" if ci else "n/a"
    rows = [
        ("items in A / in B / in both", f"{items['a']} / {items['b']} / {items['common']}"),
        ("identical answers", f"{stats['identical_responses']} of {items['common']}"),
        ("accuracy A (common items)", pct(acc["a"])),
        ("accuracy B (common items)", pct(acc["b"])),
        (
            "delta B − A",
            (f"{acc['delta']:+.1%}" if acc["delta"] is not None else "n/a")
            + f" ({acc['confidence']:.0%} paired bootstrap CI {ci_text})",
        ),
        ("right in A only (B got worse)", mc["right_in_a_only"]),
        ("right in B only (B got better)", mc["right_in_b_only"]),
        ("McNemar exact p", f"{mc['p_value']:.4g}"),
    ]
    body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table class='stats meta' id='mcnemar'>{body}</table>"


def _outcome_of(rank: int | None) -> str:
    return OUTCOME_NAMES.get(rank, "missing") if rank is not None else "missing"


def compare_rows(rows: Sequence[Mapping[str, Any]], run_a: str, run_b: str, *, link: bool) -> str:
    if not rows:
        return "<p class='sub' id='no-items'>no items</p>"

    def item_cell(row: Mapping[str, Any]) -> str:
        if not link:
            return escape(row["item_id"])
        item = q(str(row["item_id"]))
        return (
            f"{escape(row['item_id'])}<br><a href='{pages.href(f'/runs/{q(run_a)}/items/{item}')}'>A</a> · "
            f"<a href='{pages.href(f'/runs/{q(run_b)}/items/{item}')}'>B</a>"
        )

    out = [
        "<table class='items compare'><tr><th>item</th><th>change</th><th>question</th><th>gold</th>"
        "<th>answer A</th><th>A</th><th>answer B</th><th>B</th></tr>"
    ]
    for row in rows:
        a_name, b_name = _outcome_of(row.get("a_outcome")), _outcome_of(row.get("b_outcome"))
        a_text = clip_cell(row, "a_response") or clip_cell(row, "a_error")
        b_text = clip_cell(row, "b_response") or clip_cell(row, "b_error")
        out.append(
            f"<tr class='pair rank-{escape(row['rank'])}' data-item='{escape(row['item_id'])}'><td>{item_cell(row)}</td>"
            f"<td>{escape(_RANK_NAMES.get(row['rank'], ''))}</td>"
            f"<td class='t'>{clip_cell(row, 'question')}</td><td class='t'>{clip_cell(row, 'gold')}</td>"
            f"<td class='t answer-a'>{a_text}</td><td class='o-{a_name}'>{a_name}</td>"
            f"<td class='t answer-b'>{b_text}</td><td class='o-{b_name}'>{b_name}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def compare_document(page: ComparePage, labels: Sequence[str], *, live: bool, note: str = "") -> str:
    """Two runs side by side: the paired figures, then the items, flipped ones first."""
    base = f"/compare/{q(page.run_a)}/{q(page.run_b)}"
    kinds = ""
    pager = ""
    if live:
        kinds = " · ".join(
            f"<b>{k}</b>" if k == page.kind else f"<a href='{pages.href(base, {'kind': k})}'>{k}</a>"
            for k in ("flipped", "changed", "all")
        )
        kinds = f"<div class='pager'>show: {kinds}</div>"
        links = []
        if page.after:
            links.append(f"<a href='{pages.href(base, {'kind': page.kind})}'>first page</a>")
        if page.next_after:
            links.append(
                f"<a class='next' href='{pages.href(base, {'kind': page.kind, 'after': page.next_after})}'>next page</a>"
            )
        pager = f"<div class='pager'>{' · '.join(links)}</div>" if links else ""
    heading = {
        "flipped": "Flipped items (right → wrong, then wrong → right)",
        "changed": "Flipped items, then the other items whose answer changed",
        "all": "Every common item, flipped first",
    }[page.kind]
    body = (
        f"<h1>Run A {escape(page.run_a)} vs run B {escape(page.run_b)}</h1>"
        f"<div class='sub'>A = {escape(labels[0])}<br>B = {escape(labels[1])}</div>"
        "<h2>Paired figures</h2>"
        + compare_stats_table(page.stats)
        + f"<h2 id='flips'>{escape(heading)}</h2>"
        + kinds
        + (f"<p class='sub'>{escape(note)}</p>" if note else "")
        + compare_rows(page.rows, page.run_a, page.run_b, link=live)
        + pager
    )
    return pages.page(f"compare {page.run_a} vs {page.run_b}", body)
