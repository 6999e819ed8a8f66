"""Headless Chromium driven over the DevTools protocol through a pipe (--remote-debugging-pipe:
NUL-separated JSON on file descriptors 3 and 4), so no websocket client is needed.

    with Chromium(tmp_path) as browser:
        page = browser.open("file:///.../report.html")
        page.console_errors, page.requests, page.evaluate("1+1"), page.screenshot(path)
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


def executable() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session
        self.console_errors: list[str] = []
        self.requests: list[str] = []

    def send(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session, timeout=timeout)

    def evaluate(self, expression: str, *, await_promise: bool = False) -> Any:
        reply = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": await_promise},
        )
        if "exceptionDetails" in reply:
            raise AssertionError(f"evaluate failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, path: Path, width: int = 1200) -> Path:
        height = int(self.evaluate("document.documentElement.scrollHeight") or 800)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


class Chromium:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Chromium:
        exe = executable()
        assert exe, "chromium is not installed (Debian: apt-get install chromium; make up installs it)"
        cmd_r, cmd_w = os.pipe()
        resp_r, resp_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4: move the child's ends
        # above 4 first, so that the dup2 calls cannot clobber each other.
        child_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(resp_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(resp_w)

        def wire() -> None:
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        self.log = (self.workdir / "chromium.log").open("wb")
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.workdir / 'profile'}", "about:blank"],
            # dup2 leaves 3 and 4 inheritable; close_fds would close them after preexec_fn
            # (everything else of ours is close-on-exec anyway).
            close_fds=False,
            preexec_fn=wire,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        os.close(child_r)
        os.close(child_w)
        self._out, self._in = cmd_w, resp_r
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):  # it may have gone already
            self.send("Browser.close", timeout=5)
        assert self.proc is not None
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self._out)
        os.close(self._in)
        self.log.close()

    # -- protocol

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from chromium")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise ConnectionError("chromium closed the pipe (crashed?); see chromium.log")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self._events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self._events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return self._events.pop(i)
            self._events.append(self._read_message(deadline))

    def open(self, url: str, *, timeout: float = 30.0) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.send(f"{domain}.enable")
        page.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired", session)
        self.collect(page, timeout)
        return page

    def navigate_by(self, page: Page, expression: str, *, timeout: float = 30.0) -> str:
        """Runs `expression` (a click, a form submission) and waits for the page it loads;
        returns the new URL. What that page logs or fetches is added to `page`."""
        page.evaluate(expression)
        self.wait_event("Page.loadEventFired", page.session)
        self.collect(page, timeout)
        return str(page.evaluate("location.href"))

    def settled(self, page: Page) -> bool:
        """The document is complete, laid out (two animation frames later), and every
        request it made has finished or failed: what it logs or fetches has arrived."""
        ready = page.evaluate(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame("
            "() => r(document.readyState))))",
            await_promise=True,
        )
        mine = [e for e in self._events if e.get("sessionId") == page.session]
        sent = {e["params"]["requestId"] for e in mine if e.get("method") == "Network.requestWillBeSent"}
        done = {
            e["params"]["requestId"]
            for e in mine
            if e.get("method") in ("Network.loadingFinished", "Network.loadingFailed")
        }
        return ready == "complete" and sent <= done

    def collect(self, page: Page, timeout: float) -> None:
        session = page.session
        deadline = time.monotonic() + timeout
        while not self.settled(page):  # a condition, not a pause
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page did not settle within {timeout:.0f} s")
        for ev in [e for e in self._events if e.get("sessionId") == session]:
            self._events.remove(ev)
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                # the message lives in exception.description; the rest of the JSON can be long
                description = details.get("exception", {}).get("description", "")
                page.console_errors.append(f"{details.get('text', '')} {description}"[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                page.console_errors.append(json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                page.console_errors.append(params["entry"].get("text", "")[:500])
            elif method == "Network.requestWillBeSent":
                page.requests.append(params["request"]["url"])


# What a test asks of a page with charts: every svg.chart drawn with a size and marks.
CHARTS_JS = """JSON.stringify([...document.querySelectorAll('svg.chart')].map(s => {
  const r = s.getBoundingClientRect();
  return {label: s.getAttribute('aria-label'), w: r.width, h: r.height,
          marks: s.querySelectorAll('rect.bar, path.line, path.whisker').length,
          empty: s.querySelectorAll('rect.frame').length > 0};
}))"""


def charts(page: Page) -> list[dict[str, Any]]:
    value = page.evaluate(CHARTS_JS)
    return list(json.loads(value))
