"""The stack's Prometheus as the observability test (tests/e2e/test_observability.py) uses it:
queries and waits on them, services of the test's own scraped through the local stack's
`spawned` file_sd targets (ops/prometheus/prometheus.local.yml), and the overview board's
data drawn as Grafana would chart it, into tests/artifacts/overview-board.png (Grafana itself
cannot run here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evalstream.common.analysis import report_html
from tests.chromium import Chromium, charts
from tests.e2e.helpers import ROOT
from tests.support import STACK, ServiceProcess, free_port

# A second stack (EVALSTREAM_PORT_OFFSET, see ops/local/stack.py) has every port shifted.
PROMETHEUS = f"http://127.0.0.1:{9090 + int(os.environ.get('EVALSTREAM_PORT_OFFSET', '0'))}"
ARTIFACTS = ROOT / "tests/artifacts"
# Prometheus scrapes the targets listed here (job `spawned`, re-read every 5 s).
SPAWNED_TARGETS = STACK / "prometheus/spawned.json"


def prom(path: str, method: str = "GET", **params: Any) -> Any:
    url = f"{PROMETHEUS}{path}"
    data = None
    if params:
        encoded = urllib.parse.urlencode(params)
        if method == "POST":
            data = encoded.encode()
        else:
            url += "?" + encoded
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=30) as r:
        body = r.read()
    if path.startswith("/api/"):
        reply = json.loads(body)
        assert reply["status"] == "success", reply
        return reply["data"]
    return body


async def until(what: str, check: Any, timeout: float = 60.0, every: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)


def finite_points(result: list[dict[str, Any]]) -> int:
    return sum(1 for series in result for _, v in series["values"] if math.isfinite(float(v)))


def _edit_targets(change: Any) -> None:
    assert SPAWNED_TARGETS.exists(), f"{SPAWNED_TARGETS} is missing: restart the stack (stack.py up)"
    targets = change(json.loads(SPAWNED_TARGETS.read_text()))
    tmp = SPAWNED_TARGETS.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets))
    tmp.replace(SPAWNED_TARGETS)  # Prometheus never reads half a file


@contextlib.contextmanager
def scraped(service: str, port: int) -> Iterator[None]:
    """Prometheus scrapes a service this test started, for as long as the block runs."""
    target = {"targets": [f"127.0.0.1:{port}"], "labels": {"service": service}}
    _edit_targets(lambda targets: [*targets, target])
    try:
        yield
    finally:
        _edit_targets(lambda targets: [t for t in targets if t != target])


def start_service(services: contextlib.ExitStack, module: str, log: Path, **env: str) -> int:
    """A service of the test's own, stopped when `services` closes; returns its HTTP port."""
    port = free_port()
    proc = ServiceProcess(module, {"HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1", **env}, log).start()
    services.callback(proc.stop)
    proc.wait_healthy(port)
    return port


def value(query: str) -> float | None:
    result = prom("/api/v1/query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


def scraped_twice(series: str) -> bool:
    """Prometheus holds two samples of `series` (what rate() needs)."""
    return bool(prom("/api/v1/query", query=f"count_over_time({series}[1m]) >= 2")["result"])


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt or fmt == "__auto":
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def screenshot_overview(panels: list[tuple[dict[str, Any], list[Any]]], tmp_path: Path) -> None:
    """The overview board's panels as Grafana would chart them (one line per series)."""
    cells = []
    for panel, results in panels:
        series = [
            (
                legend(target.get("legendFormat", ""), s["metric"])[:40],
                [(float(t), float(v)) for t, v in s["values"]],
            )
            for target, result in results
            for s in result
        ]
        chart = report_html.line_chart(
            series[:8], label=panel["title"], width=560, height=200, x_is_time=True
        )
        cells.append(f"<div class='cell'><h3>{report_html._e(panel['title'])}</h3>{chart}</div>")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><link rel='icon' href='data:,'><style>"
        "body{font-family:system-ui,sans-serif;margin:16px}.grid{display:grid;grid-template-columns:repeat(2,580px);gap:12px}"
        "h3{font-size:13px;margin:4px 0}.cell{border:1px solid #ddd;padding:6px}</style></head><body>"
        "<h2>evalstream / Pipeline overview — data from the stack's Prometheus</h2>"
        f"<div class='grid'>{''.join(cells)}</div></body></html>"
    )
    html_file = tmp_path / "overview.html"
    html_file.write_text(page)
    with Chromium(tmp_path) as browser:
        shown = browser.open(html_file.as_uri())
        assert shown.console_errors == []
        drawn = charts(shown)
        assert len(drawn) == len(panels) and all(c["marks"] > 0 for c in drawn), drawn
        shown.screenshot(ARTIFACTS / "overview-board.png", width=1220)
