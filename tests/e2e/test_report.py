"""Issue 7: the HTML run report of a real run, served by the aggregator, saved in S3 and
written by `evalctl report --html`, rendered in headless Chromium: no console errors,
nothing fetched, every chart drawn. Keeps a screenshot in tests/artifacts/report.png."""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from evalstream.common import storage
from evalstream.common.analysis import report_html
from evalstream.common.settings import SERVICE_PORTS, Settings
from tests.chromium import Chromium, charts
from tests.e2e.helpers import ROOT, evalctl, submit_wait, write_jsonl
from tests.replay_files import replay_dir

pytestmark = pytest.mark.stack

ARTIFACTS = ROOT / "tests/artifacts"
AGGREGATOR = (
    f"http://127.0.0.1:{SERVICE_PORTS['aggregator'] + int(os.environ.get('EVALSTREAM_PORT_OFFSET', '0'))}"
)


def http_get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """30 items in two categories through the replay engine: 12 right, 15 wrong, 3 without
    an answer (dead-lettered: failures with their errors)."""
    tmp = tmp_path_factory.mktemp("report")
    items = [
        {
            "id": f"r{i:03d}",
            "question": f"What is {i} + 1?",
            "answer": str(i + 1),
            "category": "arithmetic" if i % 2 else "counting",
        }
        for i in range(30)
    ]
    answers = [
        {"id": it["id"], "response": str(int(it["answer"]) + (0 if i < 12 else 1))}
        for i, it in enumerate(items[:27])
    ]
    replay = write_jsonl(replay_dir() / "answers.jsonl", answers)
    summary = submit_wait(
        write_jsonl(tmp / "report.jsonl", items),
        "--model",
        f"replay:{replay}",
        "--shard-size",
        "5",
        "--max-attempts",
        "1",
        timeout=180,
    )
    assert summary["status"] == "completed" and summary["failed"] == 3, summary
    return summary


def test_aggregator_serves_the_report_and_s3_keeps_it(run: dict[str, object], stack: Settings) -> None:
    run_id = str(run["run_id"])
    status, ctype, page = http_get(f"{AGGREGATOR}/runs/{run_id}/report.html")
    assert status == 200 and ctype.startswith("text/html"), (status, page[:300])
    assert f"Run {run_id}" in page and "40.0%" in page  # 12 of 30
    assert "95% CI" in page and "no replayed answer" in page
    assert http_get(f"{AGGREGATOR}/runs/no-such-run/report.html")[0] == 404
    assert http_get(f"{AGGREGATOR}/runs/{run_id}/other")[0] == 404
    saved = storage.get_bytes(
        storage.client(stack), stack.s3_bucket_results, report_html.object_name(run_id)
    ).decode()
    assert f"Run {run_id}" in saved and "40.0%" in saved and saved.count("<svg class='chart'") == 5


def test_evalctl_writes_the_same_report(run: dict[str, object], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    evalctl("report", str(run["run_id"]), "--html", str(out))
    page = out.read_text()
    assert f"Run {run['run_id']}" in page and "40.0%" in page and "no replayed answer" in page
    # --json still prints the summary beside it
    summary = json.loads(evalctl("report", str(run["run_id"]), "--json").stdout.splitlines()[-1])
    assert summary["accuracy"] == pytest.approx(0.4)


async def test_report_renders_in_chromium_with_every_chart_drawn(
    run: dict[str, object], tmp_path: Path
) -> None:
    url = f"{AGGREGATOR}/runs/{run['run_id']}/report.html"

    def render() -> tuple[list[str], list[str], list[dict[str, Any]], int, Path]:
        with Chromium(tmp_path) as browser:
            page = browser.open(url)
            rows = page.evaluate("document.querySelectorAll('table.failures tr').length")
            shot = page.screenshot(ARTIFACTS / "report.png")
            return page.console_errors, page.requests, charts(page), int(rows), shot

    errors, requests, drawn, rows, shot = await asyncio.to_thread(render)
    assert errors == []
    assert requests == [url], "the report fetches nothing but itself"
    by_label = {c["label"]: c for c in drawn}
    assert set(by_label) == {
        "accuracy by category",
        "accuracy by served_by",
        "latency histogram",
        "throughput over time",
        "cache hit rate",
    }
    for chart in drawn:
        assert chart["w"] > 100 and chart["h"] > 40, chart
    for label in (
        "accuracy by category",
        "accuracy by served_by",
        "latency histogram",
        "throughput over time",
    ):
        assert by_label[label]["marks"] > 0 and not by_label[label]["empty"], by_label[label]
    assert by_label["accuracy by category"]["marks"] == 4  # two bars, two interval whiskers
    assert rows == 1 + 3  # header + the three failures
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_the_browser_check_notices_errors_and_fetches(tmp_path: Path) -> None:
    """The checks above are not blind: a script error, console.error and a fetch are seen."""
    bad = tmp_path / "bad.html"
    bad.write_text("<script>console.error('boom'); missing()</script><img src='http://127.0.0.1:9/x.png'>")

    def render() -> tuple[list[str], list[str]]:
        with Chromium(tmp_path) as browser:
            page = browser.open(bad.as_uri())
            return page.console_errors, page.requests

    errors, requests = await asyncio.to_thread(render)
    assert any("boom" in e for e in errors) and any(re.search("missing", e) for e in errors)
    assert "http://127.0.0.1:9/x.png" in requests
