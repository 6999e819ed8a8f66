"""HTML of the item browser: a run's items a page at a time, and one item whole (two runs
side by side: compare_html.py).

Model output is hostile text: every value goes through pages.escape, and every page carries
pages.py's Content-Security-Policy. Pages are plain HTML with GET forms and links: nothing
on them needs script.

Long values are clipped in tables (the SQL reads only their head) and shown whole on the
item's page; an answer longer than ANSWER_SHOWN_CHARS is also served whole as plain text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evalstream.common import scoring
from evalstream.common.analysis import pages
from evalstream.common.analysis.items import OUTCOMES, PAGE_SIZE, ItemFilter, ItemPage
from evalstream.common.analysis.pages import clip_cell, escape, outcome_name, q
from evalstream.common.analysis.queries import CELL_CHARS, MAX_COUNTED

ANSWER_SHOWN_CHARS = 20_000  # on an item's page; beyond it, the plain-text link


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
    why = clip_cell(row, "error") if row.get("error") is not None else clip_cell(row, "detail")
    return (
        f"<tr class='item-row'><td>{first_cell}</td>{_outcome_cell(row)}<td>{escape(row.get('category'))}</td>"
        f"<td class='t'>{clip_cell(row, 'question')}</td><td class='t'>{clip_cell(row, 'gold')}</td>"
        f"<td class='t answer'>{clip_cell(row, 'response')}</td><td class='t'>{clip_cell(row, 'extracted')}</td>"
        f"<td class='t'>{why}</td><td>{escape(row.get('attempts'))}</td><td>{escape(row.get('served_by'))}</td>"
        f"<td>{float(row.get('latency_ms') or 0):.0f} ms</td><td>{_flags(row)}</td></tr>"
    )


def _linked_row(row: Mapping[str, Any], run_id: str) -> str:
    href = pages.href(f"/runs/{q(run_id)}/items/{q(str(row['item_id']))}")
    return _row(row, f"<a class='item' href='{href}'>{escape(row['item_id'])}</a>")


def _full_row(row: Mapping[str, Any]) -> str:
    """A row of the static report: clipped cells, and the whole item when opened."""
    clipped = dict(row)
    for column in ("question", "gold", "response", "extracted", "error", "detail"):
        text = row.get(column)
        clipped[column] = None if text is None else text[:CELL_CHARS]
        clipped[f"{column}_chars"] = None if text is None else len(text)
    return _row(
        clipped,
        f"<details class='item'><summary>{escape(row['item_id'])}</summary>{item_sections(row)}</details>",
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
            f"<option value='{escape(c)}'{' selected' if c == chosen else ''}>{escape(c)}</option>"
            for c in choices
        ]
        return f"<label>{escape(label)}<select name='{name}'>{''.join(options)}</select></label>"

    return (
        f"<form class='filters' method='get' action='{escape(action)}'>"
        + select("outcome", "outcome", list(OUTCOMES), flt.outcome)
        + select("category", "category", facets.get("category", []), flt.category)
        + select("served_by", "served by", facets.get("served_by", []), flt.served_by)
        + f"<label>text<input type='search' name='q' value='{escape(flt.text)}' maxlength='200'"
        " placeholder='in id, question, answer, error'></label>"
        "<button type='submit'>filter</button></form>"
    )


def _pager(page: ItemPage, base: str) -> str:
    counted = f"more than {MAX_COUNTED:,}" if page.matching > MAX_COUNTED else str(page.matching)
    parts = [f"<span class='matching'>{counted}</span> items match"]
    query = page.filter.query() | ({"limit": str(page.limit)} if page.limit != PAGE_SIZE else {})
    if page.after:
        parts.append(f"<a href='{pages.href(base, query)}'>first page</a>")
    if page.next_after:
        parts.append(
            f"<a class='next' href='{pages.href(base, {**query, 'after': page.next_after})}'>next page</a>"
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
        f"Browse and filter every item on the aggregator at /runs/{escape(run)}/items, or "
        f"<code>evalctl results {escape(page.run_id)}</code>.</p>"
    )
    return title + note + items_table(page, link=False)


def items_page(page: ItemPage, facets: Mapping[str, Sequence[str]], summary_line: str = "") -> str:
    run = q(page.run_id)
    body = (
        f"<h1>Items of run {escape(page.run_id)}</h1><div class='sub'>{escape(summary_line)} · "
        f"<a href='{pages.href(f'/runs/{run}/report.html')}'>report</a></div>"
        + filter_form(page.filter, facets, f"/runs/{run}/items")
        + _pager(page, f"/runs/{run}/items")
        + items_table(page, link=True)
        + _pager(page, f"/runs/{run}/items")
    )
    return pages.page(f"items of run {page.run_id}", body)


def _pre(field_name: str, text: str | None, empty: str = "(none)") -> str:
    if text is None:
        return f"<p class='sub' data-field='{field_name}'>{escape(empty)}</p>"
    return f"<pre class='t' data-field='{field_name}'>{escape(text)}</pre>"


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
        body = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
        return f"<h2>Scores</h2><table class='meta' id='scores'>{body}</table>"
    out = [
        "<h2>Choices, by log-likelihood</h2>"
        f"<p class='sub'>each scored as the target delimiter {escape(repr(evidence.target_delimiter))} and the "
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
            f"<tr class='choice{' gold' if i == evidence.gold else ''}'><td>{i}</td><td class='t'>{escape(c.text)}{more}</td>"
            f"<td>{escape(_num(c.loglikelihood, 8))}</td><td>{escape(_num(c.per_char))}</td><td>{escape(c.tokens)}</td>"
            f"<td>{'yes' if c.is_greedy else 'no'}</td><td>{escape(', '.join(marks))}</td></tr>"
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
            f"<a id='whole-answer' href='{escape(answer_url)}'>the whole answer as plain text</a>"
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
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in meta)
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
        f"<h1>Item {escape(item['item_id'])}</h1><div class='sub'>run {escape(run_id)} · "
        f"<a href='{pages.href(f'/runs/{run}/report.html')}'>report</a> · "
        f"<a href='{pages.href(f'/runs/{run}/items')}'>all items</a></div>"
        + item_sections(item, answer_url=f"/runs/{run}/items/{item_q}/response.txt")
    )
    return pages.page(f"item {item['item_id']} of run {run_id}", body)
