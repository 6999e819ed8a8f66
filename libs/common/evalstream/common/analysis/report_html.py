"""The run report as one self-contained HTML page: inline CSS and server-drawn inline SVG,
no script and nothing fetched, so it opens anywhere (a browser, an S3 console, a mail).
Its Content-Security-Policy (a <meta>, so that the copy in S3 and a file carry it too)
forbids every script; the items it lists are hostile text (items_html).

`collect()` reads what the page needs from PostgreSQL (the summary of reports.summarise
plus a latency histogram, throughput over time and the failures, all aggregated in SQL so
that a run of a million items costs a few small queries); `render()` is pure.

Served by the aggregator at /runs/<run_id>/report.html, saved next to report.json in S3
(runs/<run_id>/report.html) when a run completes, and written by `evalctl report --html`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from evalstream.common import keys
from evalstream.common.analysis import items, items_html, pages, queries
from evalstream.common.analysis.charts import bar_chart, column_chart, line_chart
from evalstream.common.analysis.charts import escape_label as _e
from evalstream.common.analysis.reports import score_rows, summarise

# Latency histogram edges in ms: the Prometheus buckets (10 ms .. 60 s) and a few below, so
# that cached and null-model answers (about 0 ms) show where they are.
LATENCY_EDGES_MS = (1, 5, 10, 25, 50, 100, 250, 500, 800, 1000, 2500, 5000, 10000, 20000, 30000, 60000)
MAX_FAILURES_SHOWN = 200
STATIC_ITEMS_SHOWN = 100  # rows of the items table in a report file (each opens whole)
TIMELINE_BUCKETS = 60
Z95 = 1.959964


def object_name(run_id: str) -> str:
    """Where the page is kept in the results bucket (beside report.json)."""
    return keys.run_object_name(run_id, "report.html")


@dataclass
class ReportData:
    summary: dict[str, Any]
    latency_counts: list[int]  # len(LATENCY_EDGES_MS) + 1: below the first edge .. above the last
    timeline_step_s: float
    timeline: list[tuple[float, int, int]]  # (seconds since the run started, results, of which failed)
    failures: list[dict[str, Any]] = field(default_factory=list)
    generated_at: str = ""
    items: items.ItemPage | None = None  # the first page, failed and wrong first
    facets: dict[str, list[str]] = field(default_factory=dict)  # filter choices
    live: bool = False  # served by the aggregator (filter form, links) vs a file


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion: unlike the normal approximation it stays in
    [0, 1] and is honest for small n and for accuracies near 0 or 1. With fractional scores
    `successes` is the score sum (an approximation then)."""
    if n <= 0:
        return (0.0, 1.0)
    p = min(1.0, max(0.0, successes / n))
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


async def collect(
    conn: asyncpg.Connection | asyncpg.Pool,
    run_id: str,
    summary: dict[str, Any] | None = None,
    *,
    live: bool = False,
) -> ReportData:
    """Raises KeyError for an unknown run (as summarise does). `live`: for the aggregator's
    page (a page of clipped rows with links); else for a file (rows that open whole)."""
    summary = summary or await summarise(conn, run_id)
    edges = [float(e) for e in LATENCY_EDGES_MS]
    counts = [0] * (len(edges) + 1)
    for r in await conn.fetch(queries.LATENCY_HISTOGRAM, run_id, edges):
        counts[r["b"]] += r["n"]
    times = await conn.fetchrow(queries.RUN_SPAN, run_id)
    timeline: list[tuple[float, int, int]] = []
    step = 1.0
    if times is not None and times["last"] is not None:
        span_s = max(1.0, (times["last"] - times["start"]).total_seconds())
        step = _nice_step(span_s / TIMELINE_BUCKETS)
        rows = {
            r["b"]: (r["n"], r["failed"])
            for r in await conn.fetch(queries.TIMELINE, run_id, times["start"], step)
        }
        # dense, so that a quiet stretch shows as zero instead of a line drawn across it
        timeline = [(b * step, *rows.get(b, (0, 0))) for b in range(max(rows, default=-1) + 1)]
    failures = [dict(r) for r in await conn.fetch(queries.FAILURES, run_id, MAX_FAILURES_SHOWN)]
    first = await items.item_page(
        conn, run_id, limit=items.PAGE_SIZE if live else STATIC_ITEMS_SHOWN, full=not live
    )
    return ReportData(
        items=first,
        facets=await items.facets(conn, run_id) if live else {},
        live=live,
        summary=summary,
        latency_counts=counts,
        timeline_step_s=step,
        timeline=timeline,
        failures=failures,
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least `raw` (readable bucket widths)."""
    if raw <= 0:
        return 1.0
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * 10**exp >= raw:
            return float(m * 10**exp)
    return float(10 ** (exp + 1))


# --------------------------------------------------------------------------- page


def _duration(ms: float) -> str:
    return f"{ms / 1000:g}s" if ms >= 1000 else f"{ms:g}ms"


def _latency_labels() -> list[str]:
    edges = LATENCY_EDGES_MS
    labels = [f"<{_duration(edges[0])}"]
    labels += [f"{_duration(a)}–{_duration(b)}" for a, b in itertools.pairwise(edges)]
    labels.append(f">{_duration(edges[-1])}")
    return labels


def _breakdown_rows(breakdown: dict[str, dict[str, Any]]) -> list[tuple[str, float, float, float, str]]:
    rows = []
    for name, b in sorted(breakdown.items()):
        n, acc = b["total"], b["accuracy"] or 0.0
        lo, hi = wilson(acc * n, n)
        rows.append((name, acc, lo, hi, f"n={n}" + (f", {b['failed']} failed" if b.get("failed") else "")))
    return rows


def _card(title: str, value: str, note: str = "") -> str:
    return (
        f"<div class='card'><div class='k'>{_e(title)}</div><div class='v'>{_e(value)}</div>"
        f"<div class='n'>{_e(note)}</div></div>"
    )


def _ms(v: float | None) -> str:
    return f"{v:.0f} ms" if v is not None else "n/a"


_CSS = (
    """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1080px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px}.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:16px}
.card{border:1px solid #ddd;border-radius:6px;padding:10px 14px;min-width:150px}
.card .k{font-size:12px;color:#666}.card .v{font-size:22px;font-weight:600}.card .n{font-size:12px;color:#666}
table{border-collapse:collapse;font-size:13px;width:100%}td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}
td.err{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;max-width:560px}
.grid{display:grid;grid-template-columns:1fr;gap:8px}svg.chart{display:block;max-width:100%;height:auto}
.meta td:first-child{color:#666;width:160px}
"""
    + pages.TABLE_CSS
)
CSP = pages.content_security_policy(_CSS)
CSP_HEADER = pages.content_security_policy(_CSS, header=True)


def render(data: ReportData) -> str:
    s = data.summary
    total = int(s.get("total") or 0)
    acc = s.get("accuracy")
    lo, hi = wilson((acc or 0.0) * total, total)
    lat = s.get("latency_ms") or {}
    recorded = int(s.get("recorded") or 0)
    cache_hits = int(s.get("cache_hits") or 0)
    succeeded = int(s.get("succeeded") or 0)
    failed = int(s.get("failed") or 0)
    cache_rate = cache_hits / succeeded if succeeded else None
    title = f"evalstream run {s['run_id']}"

    cards = "".join(
        [
            _card(
                "accuracy",
                pages.pct(acc),
                f"95% CI {lo:.1%} – {hi:.1%} (Wilson, n={total})" if acc is not None else "",
            ),
            _card("items", f"{recorded} / {total}", f"{succeeded} answered, {failed} failed"),
            _card("cache hit rate", pages.pct(cache_rate), f"{cache_hits} of {succeeded} answers"),
            _card(
                "latency p50", _ms(lat.get("p50")), f"p95 {_ms(lat.get('p95'))}, p99 {_ms(lat.get('p99'))}"
            ),
            _card(
                "throughput",
                f"{s['items_per_s']} items/s" if s.get("items_per_s") is not None else "n/a",
                f"over {s.get('duration_s') or 0:.1f} s",
            ),
            _card("retried", str(s.get("retried", 0)), f"{s.get('truncated', 0)} truncated answers"),
        ]
    )
    step = data.timeline_step_s
    throughput = [
        ("results/s", [(t, n / step) for t, n, _ in data.timeline]),
        ("failures/s", [(t, f / step) for t, _, f in data.timeline]),
    ]
    cache_rows = (
        [
            ("from cache", cache_hits / succeeded, None, None, f"{cache_hits} items"),
            (
                "generated",
                (succeeded - cache_hits) / succeeded,
                None,
                None,
                f"{succeeded - cache_hits} items",
            ),
        ]
        if succeeded
        else []
    )
    failures = "".join(
        f"<tr><td>{_e(f['item_id'])}</td><td class='err'>{_e((f['error'] or '')[:600])}</td>"
        f"<td>{_e(f['attempts'])}</td><td>{_e(f['served_by'])}</td><td>{_e(f['category'] or '')}</td></tr>"
        for f in data.failures
    )
    more = (
        f"<p class='sub'>showing {len(data.failures)} of {failed} failures "
        f"(all of them: <code>evalctl results {_e(s['run_id'])}</code>)</p>"
        if failed > len(data.failures)
        else ""
    )
    failures_html = (
        "<table class='failures'><tr><th>item</th><th>error</th><th>attempts</th><th>served by</th>"
        f"<th>category</th></tr>{failures}</table>{more}"
        if data.failures
        else "<p class='sub'>no failures</p>"
    )
    tokens = s.get("tokens") or {}
    meta_rows = [
        ("status", s.get("status")),
        ("model", s.get("model")),
        ("grader", s.get("grader")),
        ("created", s.get("created_at")),
        ("completed", s.get("completed_at")),
        ("tokens in / out", f"{tokens.get('prompt', 0)} / {tokens.get('completion', 0)}"),
        ("accuracy (answered only)", pages.pct(s.get("accuracy_answered"))),
        ("dataset sha256", s.get("dataset_sha256")),
        ("manifest sha256", s.get("manifest_sha256")),
        ("report generated", data.generated_at),
    ]
    meta = "".join(
        f"<tr><td>{_e(k)}</td><td>{_e(v if v is not None else '')}</td></tr>" for k, v in meta_rows
    )
    score_table = "".join(
        f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in score_rows(s.get("scores"))
    )
    scores_html = (
        f"<h2>lm-eval scores ({_e(s['scores']['grader'])})</h2><table class='meta' id='scores'>{score_table}</table>"
        if score_table
        else ""
    )
    by_category = _breakdown_rows(s.get("by_category") or {})
    by_served = _breakdown_rows(s.get("by_served_by") or {})
    items_section = items_html.report_section(data.items, data.facets, live=data.live) if data.items else ""
    return (
        pages.head(title, _CSS, CSP)
        + f"""<body>
<h1>Run {_e(s["run_id"])}{f" — {_e(s['name'])}" if s.get("name") else ""}</h1>
<div class="sub">model {_e(s.get("model"))} · grader {_e(s.get("grader"))} · {_e(s.get("status"))}</div>
<div class="cards">{cards}</div>
{scores_html}
<h2>Accuracy by category</h2>
<div class="grid" id="by-category">{bar_chart(by_category, label="accuracy by category")}</div>
<h2>Accuracy by served_by (worker group / model)</h2>
<div class="grid" id="by-served-by">{bar_chart(by_served, label="accuracy by served_by")}</div>
<h2>Latency per item (answered items)</h2>
<div class="grid" id="latency">{column_chart(_latency_labels(), data.latency_counts, label="latency histogram")}</div>
<h2>Throughput over time (seconds since the run started, {step:g} s buckets)</h2>
<div class="grid" id="throughput">{line_chart(throughput, label="throughput over time")}</div>
<h2>Answer cache</h2>
<div class="grid" id="cache">{bar_chart(cache_rows, label="cache hit rate")}</div>
{items_section}
<h2>Failures ({failed})</h2>
{failures_html}
<h2>Run</h2>
<table class="meta">{meta}</table>
</body></html>
"""
    )


async def render_run(
    conn: asyncpg.Connection | asyncpg.Pool,
    run_id: str,
    summary: dict[str, Any] | None = None,
    *,
    live: bool = False,
) -> str:
    return render(await collect(conn, run_id, summary, live=live))
