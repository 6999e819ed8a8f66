"""Issue 18, hostile answers: on the real stack, through a replay run whose answers (and
questions and categories) are made of HTML and script, they stay text, with no script run and
nothing fetched, on the served pages, in the copy in S3 and in `evalctl report --html`; and
the detector of a script that ran is not blind. The report's other pages:
tests/e2e/test_item_browser.py."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalstream.common import storage
from evalstream.common.analysis import report_html
from evalstream.common.settings import Settings
from tests.chromium import Chromium
from tests.e2e.helpers import evalctl, replay_run, wait_for
from tests.e2e.test_report import AGGREGATOR

pytestmark = pytest.mark.stack


# --------------------------------------------------------------------------- hostile answers


class Listener:
    """An HTTP server that records every request: a script that ran would call it."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


def hostile_answers(port: int) -> list[str]:
    call = f"http://127.0.0.1:{port}"
    return [
        f"<script>document.title='pwned';fetch('{call}/script')</script>",
        f"<img src=\"{call}/img\" onerror=\"document.title='pwned';fetch('{call}/onerror')\">",
        f"<a href=\"javascript:fetch('{call}/js-link');document.title='pwned'\">click me</a>",
        f"[click me](javascript:fetch('{call}/md-link'))",
        f"</pre></td></tr></table></details><script>fetch('{call}/breakout')</script>",
        f'<svg onload="fetch(\'{call}/svg\')"></svg><iframe src="{call}/iframe"></iframe>',
        f'<meta http-equiv="refresh" content="0;url={call}/refresh">',
        f'<style>body{{background:url({call}/css)}}</style><link rel=stylesheet href="{call}/link">',
        f"' onmouseover=\"fetch('{call}/attr')\" x='",
    ]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory, listener: Listener) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hostile")
    texts = hostile_answers(listener.port)
    call = f"http://127.0.0.1:{listener.port}"
    items = [
        {
            "id": f"h{i}",
            "question": f"Say hello <script>fetch('{call}/question')</script> #{i}",
            "answer": "hello",
            "category": f"<img src={call}/category>",
        }
        for i in range(len(texts))
    ]
    summary = replay_run(tmp, "hostile", items, {f"h{i}": t for i, t in enumerate(texts)})
    return {"summary": summary, "texts": texts, "tmp": tmp}


INERT_JS = """JSON.stringify({
  title: document.title,
  scripts: document.scripts.length,
  frames: document.querySelectorAll('iframe, img, svg:not(.chart), object, embed, link[rel=stylesheet]').length,
  js_links: [...document.querySelectorAll('a')].filter(a => !a.getAttribute('href').startsWith('/')
      && !a.getAttribute('href').startsWith('http://127.0.0.1:') ).length,
  handlers: [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
  answers: [...document.querySelectorAll('pre[data-field=response]')].map(p => p.textContent),
})"""


def hostile_pages(hostile: dict[str, Any], stack: Settings) -> list[str]:
    run_id = hostile["summary"]["run_id"]
    base = f"{AGGREGATOR}/runs/{run_id}"
    stored = hostile["tmp"] / "stored-report.html"
    stored.write_bytes(
        storage.get_bytes(storage.client(stack), stack.s3_bucket_results, report_html.object_name(run_id))
    )
    written = hostile["tmp"] / "evalctl-report.html"
    evalctl("report", run_id, "--html", str(written))
    return [
        f"{base}/report.html",
        f"{base}/items",
        f"{base}/items?outcome=wrong&q=script",
        *(f"{base}/items/h{i}" for i in range(len(hostile["texts"]))),
        f"{AGGREGATOR}/compare/{run_id}/{run_id}?kind=all",
        stored.as_uri(),
        written.as_uri(),
    ]


async def test_hostile_answers_stay_text_and_run_nothing(
    hostile: dict[str, Any], listener: Listener, stack: Settings, tmp_path: Path
) -> None:
    urls = hostile_pages(hostile, stack)

    def visit() -> list[tuple[str, dict[str, Any], list[str], list[str]]]:
        out = []
        with Chromium(tmp_path) as browser:
            for url in urls:
                page = browser.open(url)
                # hover and click everything a model might have made clickable
                page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true); 0")
                page.evaluate(
                    "[...document.querySelectorAll('pre, td')].forEach(e => e.dispatchEvent(new MouseEvent('mouseover'))); 0"
                )
                out.append((url, json.loads(page.evaluate(INERT_JS)), page.console_errors, page.requests))
        return out

    seen = await asyncio.to_thread(visit)
    texts = hostile["texts"]
    for url, state, errors, requests in seen:
        assert state["title"] != "pwned" and state["scripts"] == 0, (url, state)
        assert state["frames"] == 0 and state["js_links"] == 0 and state["handlers"] == 0, (url, state)
        assert requests == [url], (url, requests)  # the page itself, nothing else
        assert errors == [], (url, errors)
    # each item's page reads its answer back, character for character
    item_pages = [s for u, s, _, _ in seen if re.search(r"/items/h\d+$", u)]
    assert [p["answers"] for p in item_pages] == [[t] for t in texts]
    # the stored report and the evalctl file open every row to the whole answer, as text
    for _, state, _, _ in seen[-2:]:
        assert sorted(state["answers"]) == sorted(texts)
    assert listener.hits == []


async def test_the_execution_detector_is_not_blind(listener: Listener, tmp_path: Path) -> None:
    """The same answers pasted in raw do run (title changed, the listener called), and
    the report's Content-Security-Policy alone stops them: the checks above can fail, and
    the policy is a second wall behind the escaping."""
    texts = hostile_answers(listener.port)
    raw = tmp_path / "raw.html"
    raw.write_text("<!doctype html><title>raw</title><body>" + "".join(f"<div>{t}</div>" for t in texts))
    # A <meta refresh> is a navigation, which no CSP directive governs (navigate-to never
    # shipped): only the escaping stops that one, as the test above shows it does.
    walled = tmp_path / "walled.html"
    walled.write_text(
        f'<!doctype html><meta http-equiv="Content-Security-Policy" content="{report_html.CSP}">'
        "<title>walled</title><body>" + "".join(f"<div>{t}</div>" for t in texts if "refresh" not in t)
    )

    def visit(path: Path) -> str:
        with Chromium(tmp_path / path.stem) as browser:
            page = browser.open(path.as_uri())
            return str(page.evaluate("document.title"))

    (tmp_path / "raw").mkdir()
    (tmp_path / "walled").mkdir()
    assert await asyncio.to_thread(visit, walled) == "walled"
    assert listener.hits == [], "the policy let something through"
    assert await asyncio.to_thread(visit, raw) == "pwned"
    wait_for(lambda: {"/script", "/img"} <= set(listener.hits), 10, "the raw page's calls")
    listener.hits.clear()
