"""HTML of the item browser (a run's items, one item) and of two runs side by side.

Model output is hostile text. Every value goes through html.escape and lands in text
nodes or quoted attributes only; nothing a model wrote ever becomes markup, a link, a URL
or a style. Behind that, every page carries a Content-Security-Policy that allows no
script at all, no fetch, no frame and only the page's own stylesheet (by hash), so that
even a rendering bug could not run anything. Pages are plain HTML with GET forms and
links: nothing on them needs script.

Long values are clipped in tables (the SQL reads only their head) and shown whole on the
item's page; an answer longer than ANSWER_SHOWN_CHARS is also served whole as plain text.
"""

from __future__ import annotations

import base64
import hashlib
import html
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from evalstream.common import scoring
from evalstream.common.items import (
    CELL_CHARS,
    MAX_COUNTED,
    OUTCOME_NAMES,
    OUTCOMES,
    PAGE_SIZE,
    ComparePage,
    ItemFilter,
    ItemPage,
)

ANSWER_SHOWN_CHARS = 20_000  # on an item's page; beyond it, the plain-text link

# Everything a page may load. No script-src: default-src 'none' forbids every script.
_POLICY = "default-src 'none'; style-src {styles}; img-src data:; form-action 'self'; base-uri 'none'"
# Only honoured as an HTTP header (a <meta> policy cannot say it)
HEADER_ONLY_POLICY = "; frame-ancestors 'none'"

TABLE_CSS = """
.items td,.items th{font-size:12px}.items td.t{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;max-width:320px}
.o-failed{color:#a11;font-weight:600}.o-wrong{color:#b54708;font-weight:600}.o-right{color:#276738}.o-ungraded{color:#555}
.more{color:#888;font-style:italic}form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:8px 0 12px;font-size:13px}
form.filters label{display:flex;flex-direction:column;gap:2px}pre.t{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;border:1px solid #e3e3e3;padding:8px;font-size:12px;max-height:none}
.pager{margin:10px 0;font-size:13px}.flag{background:#fde7c4;border-radius:3px;padding:0 4px;font-size:11px}
details.item summary{cursor:pointer}.stats td:first-child{color:#666;width:260px}
"""
BASE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px}table{border-collapse:collapse;font-size:13px;width:100%}
td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}.meta td:first-child{color:#666;width:180px}
"""
CSS = BASE_CSS + TABLE_CSS


def style_hash(css: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(css.encode()).digest()).decode() + "'"


def content_security_policy(*styles: str, header: bool = False) -> str:
    """The policy for a page whose only <style> blocks are `styles`."""
    policy = _POLICY.format(styles=" ".join(style_hash(s) for s in styles))
    return policy + (HEADER_ONLY_POLICY if header else "")


CSP = content_security_policy(CSS)
CSP_HEADER = content_security_policy(CSS, header=True)
# For text served as is (an answer as text/plain): nothing at all, and a sandbox.
TEXT_CSP_HEADER = "default-src 'none'; sandbox; frame-ancestors 'none'"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def head(title: str, css: str, csp: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{_e(title)}</title><style>{css}</style></head>\n"
    )


def _page(title: str, body: str) -> str:
    return head(title, CSS, CSP) + f"<body>\n{body}\n</body></html>\n"


def q(value: str) -> str:
    """A path segment (an item or run id may hold any character)."""
    return urllib.parse.quote(value, safe="")


def _href(path: str, params: Mapping[str, str] | None = None) -> str:
    query = urllib.parse.urlencode(params or {})
    return _e(path + (f"?{query}" if query else ""))


def _clip_cell(row: Mapping[str, Any], column: str) -> str:
    """A table cell's text: the head the query read, and how much more there is."""
    text = row.get(column)
    if text is None:
        return ""
    total = row.get(f"{column}_chars") or len(text)
    more = f"<span class='more'> … +{total - len(text)} chars</span>" if total > len(text) else ""
    return _e(text) + more


def outcome_name(row: Mapping[str, Any]) -> str:
    return OUTCOME_NAMES.get(row.get("outcome"), "?")  # type: ignore[arg-type]


def _outcome_cell(row: Mapping[str, Any]) -> str:
    name = outcome_name(row)
    return f"<td class='o-{name}'>{name}</td>"


def _flags(row: Mapping[str, Any]) -> str:
    flags = []
    if row.get("truncated"):
        flags.append(
            "<span class='flag' title='the prompt was cut to fit the context window'>prompt truncated</span>"
        )
    if row.get("cache_hit"):
        flags.append("<span class='flag'>cache</span>")
    return " ".join(flags)


_HEADER = (
    "<tr><th>item</th><th>outcome</th><th>category</th><th>question</th><th>gold</th><th>answer</th>"
    "<th>extracted</th><th>grader detail / error</th><th>attempts</th><th>served by</th><th>latency</th><th></th></tr>"
)


def _row(row: Mapping[str, Any], first_cell: str) -> str:
    why = _clip_cell(row, "error") if row.get("error") is not None else _clip_cell(row, "detail")
    return (
        f"<tr class='item-row'><td>{first_cell}</td>{_outcome_cell(row)}<td>{_e(row.get('category'))}</td>"
        f"<td class='t'>{_clip_cell(row, 'question')}</td><td class='t'>{_clip_cell(row, 'gold')}</td>"
        f"<td class='t answer'>{_clip_cell(row, 'response')}</td><td class='t'>{_clip_cell(row, 'extracted')}</td>"
        f"<td class='t'>{why}</td><td>{_e(row.get('attempts'))}</td><td>{_e(row.get('served_by'))}</td>"
        f"<td>{float(row.get('latency_ms') or 0):.0f} ms</td><td>{_flags(row)}</td></tr>"
    )


def _linked_row(row: Mapping[str, Any], run_id: str) -> str:
    href = _href(f"/runs/{q(run_id)}/items/{q(str(row['item_id']))}")
    return _row(row, f"<a class='item' href='{href}'>{_e(row['item_id'])}</a>")


def _full_row(row: Mapping[str, Any]) -> str:
    """A row of the static report: clipped cells, and the whole item when opened."""
    clipped = dict(row)
    for column in ("question", "gold", "response", "extracted", "error", "detail"):
        text = row.get(column)
        clipped[column] = None if text is None else text[:CELL_CHARS]
        clipped[f"{column}_chars"] = None if text is None else len(text)
    return _row(
        clipped,
        f"<details class='item'><summary>{_e(row['item_id'])}</summary>{item_sections(row)}</details>",
    )


def items_table(page: ItemPage, *, link: bool) -> str:
    if not page.rows:
        return "<p class='sub' id='no-items'>no items match</p>"
    body = "".join(_full_row(r) if page.full else _linked_row(r, page.run_id) for r in page.rows)
    return f"<table class='items'>{_HEADER}{body}</table>"


def filter_form(flt: ItemFilter, facets: Mapping[str, Sequence[str]], action: str) -> str:
    def select(name: str, label: str, choices: Sequence[str], chosen: str | None) -> str:
        options = [f"<option value=''{' selected' if chosen is None else ''}>any</option>"]
        options += [
            f"<option value='{_e(c)}'{' selected' if c == chosen else ''}>{_e(c)}</option>" for c in choices
        ]
        return f"<label>{_e(label)}<select name='{name}'>{''.join(options)}</select></label>"

    return (
        f"<form class='filters' method='get' action='{_e(action)}'>"
        + select("outcome", "outcome", list(OUTCOMES), flt.outcome)
        + select("category", "category", facets.get("category", []), flt.category)
        + select("served_by", "served by", facets.get("served_by", []), flt.served_by)
        + f"<label>text<input type='search' name='q' value='{_e(flt.text)}' maxlength='200'"
        " placeholder='in id, question, answer, error'></label>"
        "<button type='submit'>filter</button></form>"
    )


def _pager(page: ItemPage, base: str) -> str:
    counted = f"more than {MAX_COUNTED:,}" if page.matching > MAX_COUNTED else str(page.matching)
    parts = [f"<span class='matching'>{counted}</span> items match"]
    query = page.filter.query() | ({"limit": str(page.limit)} if page.limit != PAGE_SIZE else {})
    if page.after:
        parts.append(f"<a href='{_href(base, query)}'>first page</a>")
    if page.next_after:
        parts.append(
            f"<a class='next' href='{_href(base, {**query, 'after': page.next_after})}'>next page</a>"
        )
    return f"<div class='pager'>{' · '.join(parts)}</div>"


def report_section(page: ItemPage, facets: Mapping[str, Sequence[str]], *, live: bool) -> str:
    """The items part of a run's report. Live (served by the aggregator): the filter form,
    the first page and links into the browser. Static (a file, the copy in S3): the first
    page, each row opening to its whole item."""
    run = q(page.run_id)
    title = "<h2 id='items'>Items — failed and wrong first</h2>"
    if live:
        return (
            title
            + filter_form(page.filter, facets, f"/runs/{run}/items")
            + _pager(page, f"/runs/{run}/items")
            + items_table(page, link=True)
        )
    note = (
        f"<p class='sub'>the first {len(page.rows)} of {page.matching} items; open an item for all of it. "
        f"Browse and filter every item on the aggregator at /runs/{_e(run)}/items, or "
        f"<code>evalctl results {_e(page.run_id)}</code>.</p>"
    )
    return title + note + items_table(page, link=False)


def items_page(page: ItemPage, facets: Mapping[str, Sequence[str]], summary_line: str = "") -> str:
    run = q(page.run_id)
    body = (
        f"<h1>Items of run {_e(page.run_id)}</h1><div class='sub'>{_e(summary_line)} · "
        f"<a href='{_href(f'/runs/{run}/report.html')}'>report</a></div>"
        + filter_form(page.filter, facets, f"/runs/{run}/items")
        + _pager(page, f"/runs/{run}/items")
        + items_table(page, link=True)
        + _pager(page, f"/runs/{run}/items")
    )
    return _page(f"items of run {page.run_id}", body)


def _pre(field_name: str, text: str | None, empty: str = "(none)") -> str:
    if text is None:
        return f"<p class='sub' data-field='{field_name}'>{_e(empty)}</p>"
    return f"<pre class='t' data-field='{field_name}'>{_e(text)}</pre>"


def _num(value: float | None, digits: int = 6) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def scores_section(evidence: scoring.ScoreEvidence) -> str:
    """A scoring grader's reading: each choice with its log-likelihood (marked: gold, the
    pick by log-likelihood, the pick per character), or a document's log-likelihood."""
    if evidence.choices is None:
        words, n_bytes, ll = evidence.words or 0, evidence.bytes or 0, evidence.loglikelihood or 0.0
        metrics = scoring.rolling_metrics(ll, words, n_bytes)
        rows = [
            ("log-likelihood", _num(evidence.loglikelihood, 10)),
            ("tokens scored", evidence.tokens),
            ("words / UTF-8 bytes", f"{words} / {n_bytes}"),
            ("word perplexity", _num(metrics["word_perplexity"])),
            ("byte perplexity", _num(metrics["byte_perplexity"])),
            ("bits per byte", _num(metrics["bits_per_byte"])),
        ]
        body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
        return f"<h2>Scores</h2><table class='meta' id='scores'>{body}</table>"
    out = [
        "<h2>Choices, by log-likelihood</h2>"
        f"<p class='sub'>each scored as the target delimiter {_e(repr(evidence.target_delimiter))} and the "
        "choice after the question; acc picks the highest log-likelihood, acc_norm the highest per character</p>"
        "<table class='items' id='choices'><tr><th>#</th><th>choice</th><th>log-likelihood</th>"
        "<th>per character</th><th>tokens</th><th>greedy</th><th></th></tr>"
    ]
    for i, c in enumerate(evidence.choices):
        marks = [
            m
            for m, on in (
                ("gold", i == evidence.gold),
                ("acc pick", i == evidence.pred),
                ("acc_norm pick", i == evidence.pred_norm),
            )
            if on
        ]
        more = f"<span class='more'> … {c.chars} chars</span>" if c.chars > len(c.text) else ""
        out.append(
            f"<tr class='choice{' gold' if i == evidence.gold else ''}'><td>{i}</td><td class='t'>{_e(c.text)}{more}</td>"
            f"<td>{_e(_num(c.loglikelihood, 8))}</td><td>{_e(_num(c.per_char))}</td><td>{_e(c.tokens)}</td>"
            f"<td>{'yes' if c.is_greedy else 'no'}</td><td>{_e(', '.join(marks))}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def item_sections(item: Mapping[str, Any], *, answer_url: str | None = None) -> str:
    """Everything stored of one item: what was asked, answered and judged, and why."""
    response = item.get("response")
    answer = _pre("response", response, "(no answer)")
    if response is not None and len(response) > ANSWER_SHOWN_CHARS:
        answer = _pre("response", response[:ANSWER_SHOWN_CHARS])
        whole = (
            f"<a id='whole-answer' href='{_e(answer_url)}'>the whole answer as plain text</a>"
            if answer_url
            else "the whole answer: <code>evalctl results</code>"
        )
        answer += f"<p class='more'>showing {ANSWER_SHOWN_CHARS} of {len(response)} characters · {whole}</p>"
    meta = [
        ("outcome", outcome_name(item)),
        ("score", item.get("score")),
        ("category", item.get("category")),
        ("served by", item.get("served_by")),
        ("model revision", item.get("model_revision")),
        ("attempts", item.get("attempts")),
        ("latency", f"{float(item.get('latency_ms') or 0):.1f} ms"),
        ("from the answer cache", "yes" if item.get("cache_hit") else "no"),
        ("prompt truncated to fit the context", "yes" if item.get("truncated") else "no"),
        ("tokens in / out", f"{item.get('prompt_tokens', '')} / {item.get('completion_tokens', '')}"),
    ]
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in meta)
    sections = [
        f"<table class='meta'>{rows}</table>",
        "<h2>Question</h2>" + _pre("question", item.get("question")),
        "<h2>Gold answer</h2>" + _pre("gold", item.get("gold")),
        "<h2>Prompt as rendered</h2>" + _pre("prompt", item.get("prompt"), "(not recorded)"),
        "<h2>Answer</h2>" + answer,
        "<h2>Extracted by the grader</h2>" + _pre("extracted", item.get("extracted")),
        "<h2>Grader detail</h2>" + _pre("detail", item.get("detail")),
        "<h2>Grading evidence (test output)</h2>" + _pre("evidence", item.get("evidence")),
    ]
    scores = scoring.read_evidence(item.get("evidence"))
    if scores is not None:  # the choices' table instead of the raw JSON
        sections[-1] = scores_section(scores)
        sections[4] = "<h2>Scores as the engine returned them</h2>" + answer
    if item.get("error") is not None:
        sections.insert(1, "<h2>Error (last attempt)</h2>" + _pre("error", item.get("error")))
    return "".join(sections)


def item_page(run_id: str, item: Mapping[str, Any]) -> str:
    run, item_q = q(run_id), q(str(item["item_id"]))
    body = (
        f"<h1>Item {_e(item['item_id'])}</h1><div class='sub'>run {_e(run_id)} · "
        f"<a href='{_href(f'/runs/{run}/report.html')}'>report</a> · "
        f"<a href='{_href(f'/runs/{run}/items')}'>all items</a></div>"
        + item_sections(item, answer_url=f"/runs/{run}/items/{item_q}/response.txt")
    )
    return _page(f"item {item['item_id']} of run {run_id}", body)


# --------------------------------------------------------------------------- two runs

_RANK_NAMES = {0: "right in A only", 1: "right in B only", 2: "answer changed", 3: "same answer"}


def _pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None else "n/a"


def compare_stats_table(stats: Mapping[str, Any]) -> str:
    acc, mc, items = stats["accuracy"], stats["mcnemar"], stats["items"]
    ci = acc.get("ci")
    ci_text = f"{ci[0]:+.1%} .. {ci[1]:+.1%}" if ci else "n/a"
    rows = [
        ("items in A / in B / in both", f"{items['a']} / {items['b']} / {items['common']}"),
        ("identical answers", f"{stats['identical_responses']} of {items['common']}"),
        ("accuracy A (common items)", _pct(acc["a"])),
        ("accuracy B (common items)", _pct(acc["b"])),
        (
            "delta B − A",
            (f"{acc['delta']:+.1%}" if acc["delta"] is not None else "n/a")
            + f" ({acc['confidence']:.0%} paired bootstrap CI {ci_text})",
        ),
        ("right in A only (B got worse)", mc["right_in_a_only"]),
        ("right in B only (B got better)", mc["right_in_b_only"]),
        ("McNemar exact p", f"{mc['p_value']:.4g}"),
    ]
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<table class='stats meta' id='mcnemar'>{body}</table>"


def _outcome_of(rank: int | None) -> str:
    return OUTCOME_NAMES.get(rank, "missing") if rank is not None else "missing"


def compare_rows(rows: Sequence[Mapping[str, Any]], run_a: str, run_b: str, *, link: bool) -> str:
    if not rows:
        return "<p class='sub' id='no-items'>no items</p>"

    def item_cell(row: Mapping[str, Any]) -> str:
        if not link:
            return _e(row["item_id"])
        item = q(str(row["item_id"]))
        return (
            f"{_e(row['item_id'])}<br><a href='{_href(f'/runs/{q(run_a)}/items/{item}')}'>A</a> · "
            f"<a href='{_href(f'/runs/{q(run_b)}/items/{item}')}'>B</a>"
        )

    out = [
        "<table class='items compare'><tr><th>item</th><th>change</th><th>question</th><th>gold</th>"
        "<th>answer A</th><th>A</th><th>answer B</th><th>B</th></tr>"
    ]
    for row in rows:
        a_name, b_name = _outcome_of(row.get("a_outcome")), _outcome_of(row.get("b_outcome"))
        a_text = _clip_cell(row, "a_response") or _clip_cell(row, "a_error")
        b_text = _clip_cell(row, "b_response") or _clip_cell(row, "b_error")
        out.append(
            f"<tr class='pair rank-{_e(row['rank'])}' data-item='{_e(row['item_id'])}'><td>{item_cell(row)}</td>"
            f"<td>{_e(_RANK_NAMES.get(row['rank'], ''))}</td>"
            f"<td class='t'>{_clip_cell(row, 'question')}</td><td class='t'>{_clip_cell(row, 'gold')}</td>"
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
            f"<b>{k}</b>" if k == page.kind else f"<a href='{_href(base, {'kind': k})}'>{k}</a>"
            for k in ("flipped", "changed", "all")
        )
        kinds = f"<div class='pager'>show: {kinds}</div>"
        links = []
        if page.after:
            links.append(f"<a href='{_href(base, {'kind': page.kind})}'>first page</a>")
        if page.next_after:
            links.append(
                f"<a class='next' href='{_href(base, {'kind': page.kind, 'after': page.next_after})}'>next page</a>"
            )
        pager = f"<div class='pager'>{' · '.join(links)}</div>" if links else ""
    heading = {
        "flipped": "Flipped items (right → wrong, then wrong → right)",
        "changed": "Flipped items, then the other items whose answer changed",
        "all": "Every common item, flipped first",
    }[page.kind]
    body = (
        f"<h1>Run A {_e(page.run_a)} vs run B {_e(page.run_b)}</h1>"
        f"<div class='sub'>A = {_e(labels[0])}<br>B = {_e(labels[1])}</div>"
        "<h2>Paired figures</h2>"
        + compare_stats_table(page.stats)
        + f"<h2 id='flips'>{_e(heading)}</h2>"
        + kinds
        + (f"<p class='sub'>{_e(note)}</p>" if note else "")
        + compare_rows(page.rows, page.run_a, page.run_b, link=live)
        + pager
    )
    return _page(f"compare {page.run_a} vs {page.run_b}", body)


def error_page(status: int, message: str) -> str:
    return _page(f"{status}", f"<h1>{status}</h1><p>{_e(message)}</p>")
