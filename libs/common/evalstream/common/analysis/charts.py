"""The run report's charts, drawn on the server as inline SVG (no script, nothing fetched):
horizontal bars with interval whiskers, a histogram's columns, lines over time. Pure."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from datetime import UTC, datetime

from evalstream.common.analysis.pages import escape

# The report's charts and page print a missing value as "None" (the item pages: nothing).
escape_label = functools.partial(escape, none="None")
_e = escape_label
PALETTE = ("#3b6fd8", "#e07b39", "#3a9a5b", "#b84a8f", "#8a6d3b", "#4aa3b8", "#c94c4c", "#6b6bd6")
_FONT = "font-family='system-ui,sans-serif' font-size='11'"


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v / 1000:.3g}k"
    return f"{v:.3g}"


def _empty(width: int, height: int, label: str, text: str = "no data") -> str:
    return (
        f"<svg class='chart' role='img' aria-label='{_e(label)}' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}'><rect class='frame' x='0.5' y='0.5' width='{width - 1}' "
        f"height='{height - 1}' fill='none' stroke='#ccc'/><text x='{width / 2}' y='{height / 2}' "
        f"text-anchor='middle' {_FONT} fill='#888'>{_e(text)}</text></svg>"
    )


def bar_chart(
    rows: Sequence[tuple[str, float, float | None, float | None, str]],
    *,
    label: str,
    width: int = 640,
    vmax: float = 1.0,
    percent: bool = True,
) -> str:
    """Horizontal bars: (name, value, low, high, note) with optional interval whiskers."""
    if not rows:
        return _empty(width, 60, label)
    bar_h, gap, left, right = 18, 8, 190, 150
    height = len(rows) * (bar_h + gap) + gap + 18
    plot_w = width - left - right
    out = [
        f"<svg class='chart' role='img' aria-label='{_e(label)}' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}'>"
    ]
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        x = left + frac * plot_w
        tick = f"{frac * vmax:.0%}" if percent else _fmt(frac * vmax)
        out.append(
            f"<line x1='{x:.1f}' y1='{gap}' x2='{x:.1f}' y2='{height - 18}' stroke='#eee'/>"
            f"<text x='{x:.1f}' y='{height - 4}' text-anchor='middle' {_FONT} fill='#666'>{tick}</text>"
        )
    for i, (name, value, lo, hi, note) in enumerate(rows):
        y = gap + i * (bar_h + gap)
        w = max(0.0, min(1.0, value / vmax if vmax else 0.0)) * plot_w
        shown = f"{value:.1%}" if percent else _fmt(value)
        out.append(
            f"<text x='{left - 6}' y='{y + bar_h - 5}' text-anchor='end' {_FONT}>{_e(name[:32])}</text>"
            f"<rect class='bar' x='{left}' y='{y}' width='{max(w, 1.0):.1f}' height='{bar_h}' "
            f"fill='{PALETTE[i % len(PALETTE)]}'><title>{_e(name)}: {_e(shown)} {_e(note)}</title></rect>"
        )
        if lo is not None and hi is not None:
            x1, x2 = left + lo / vmax * plot_w, left + hi / vmax * plot_w
            ym = y + bar_h / 2
            out.append(
                f"<path class='whisker' d='M{x1:.1f},{ym - 5}v10M{x1:.1f},{ym}H{x2:.1f}M{x2:.1f},{ym - 5}v10' "
                f"stroke='#222' fill='none'/>"
            )
        out.append(f"<text x='{left + plot_w + 8}' y='{y + bar_h - 5}' {_FONT}>{_e(shown)} {_e(note)}</text>")
    out.append("</svg>")
    return "".join(out)


def column_chart(
    labels: Sequence[str], values: Sequence[float], *, label: str, width: int = 640, height: int = 220
) -> str:
    """Vertical bars over categorical x (a histogram's buckets)."""
    if not values or not any(values):
        return _empty(width, height, label)
    left, bottom, top = 44, 58, 10
    plot_w, plot_h = width - left - 40, height - bottom - top
    vmax = max(values)
    slot = plot_w / len(values)
    out = [
        f"<svg class='chart' role='img' aria-label='{_e(label)}' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}'>",
        f"<line x1='{left}' y1='{top + plot_h}' x2='{width - 10}' y2='{top + plot_h}' stroke='#999'/>",
        f"<text x='{left - 4}' y='{top + 8}' text-anchor='end' {_FONT}>{_fmt(vmax)}</text>",
    ]
    for i, (name, v) in enumerate(zip(labels, values, strict=True)):
        h = v / vmax * plot_h if vmax else 0
        x = left + i * slot
        out.append(
            f"<rect class='bar' x='{x + 1:.1f}' y='{top + plot_h - h:.1f}' width='{max(slot - 2, 1):.1f}' "
            f"height='{h:.1f}' fill='{PALETTE[0]}'><title>{_e(name)}: {v:g}</title></rect>"
            f"<text transform='translate({x + slot / 2:.1f},{top + plot_h + 12}) rotate(35)' {_FONT} "
            f"fill='#555'>{_e(name)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    label: str,
    width: int = 640,
    height: int = 220,
    x_is_time: bool = False,
    y_unit: str = "",
) -> str:
    """Lines over a numeric x (seconds, or unix time with x_is_time)."""
    points = [p for _, pts in series for p in pts if math.isfinite(p[1])]
    if not points:
        return _empty(width, height, label)
    left, bottom, top, right = 52, 26, 10, 150
    plot_w, plot_h = width - left - right, height - bottom - top
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y1 = max(max(p[1] for p in points), 0.0)
    y0 = min(min(p[1] for p in points), 0.0)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    def xtick(x: float) -> str:
        if x_is_time:
            return datetime.fromtimestamp(x, UTC).strftime("%H:%M:%S")
        return f"{x:g}s"

    out = [
        f"<svg class='chart' role='img' aria-label='{_e(label)}' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}'>",
        f"<line x1='{left}' y1='{top + plot_h}' x2='{left + plot_w}' y2='{top + plot_h}' stroke='#999'/>",
        f"<line x1='{left}' y1='{top}' x2='{left}' y2='{top + plot_h}' stroke='#999'/>",
    ]
    for frac in (0.0, 0.5, 1.0):
        yv = y0 + frac * (y1 - y0)
        xv = x0 + frac * (x1 - x0)
        out.append(
            f"<text x='{left - 4}' y='{sy(yv) + 4:.1f}' text-anchor='end' {_FONT}>{_fmt(yv)}{_e(y_unit)}</text>"
            f"<text x='{sx(xv):.1f}' y='{height - 8}' text-anchor='middle' {_FONT} fill='#555'>{_e(xtick(xv))}</text>"
        )
    for i, (name, pts) in enumerate(series):
        good = [(x, y) for x, y in sorted(pts) if math.isfinite(y)]
        if not good:
            continue
        colour = PALETTE[i % len(PALETTE)]
        d = "M" + "L".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
        if len(good) == 1:  # a single sample still shows
            d += "h2"
        out.append(
            f"<path class='line' d='{d}' stroke='{colour}' stroke-width='2' fill='none'><title>{_e(name)}</title></path>"
            f"<text x='{left + plot_w + 8}' y='{top + 12 + 14 * i}' {_FONT} fill='{colour}'>{_e(name[:24])}</text>"
        )
    out.append("</svg>")
    return "".join(out)
