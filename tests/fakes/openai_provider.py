"""A fake OpenAI-compatible provider for tests: a real HTTP server on 127.0.0.1, in a thread.

It answers POST <base>/chat/completions, and POST <base>/completions: a raw prompt's
continuation, or with `echo` the prompt's log-probabilities (`logprobs`, as vLLM does;
`prompt_logprobs = False` answers without them, as a chat-only provider does). What it answers is up to the test:

* `answer(messages) -> text` gives the content of a normal reply (default: the sum for
  "What is A + B?", else "ok");
* `script(n, body) -> Reply | None` may replace any reply: the n-th request (from 1) gets
  a 429 storm, a 5xx, a slow or hung response, a malformed body... (None: answer normally);
* `rate_limit(per_second, retry_after)` makes it behave like a real rate-limited API: more
  requests in one second than allowed get 429 with Retry-After.

Every request is recorded (headers, body, the status sent), so tests can count calls and
check what the client sent.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SUM = re.compile(r"What is (-?\d+) \+ (-?\d+)\?")
_TOKEN = re.compile(r"\s*\S+|\s+")


def fake_tokens(text: str) -> list[tuple[str, int]]:
    """The fake's tokenizer: words with their leading spaces, and their character offsets."""
    return [(m[0], m.start()) for m in _TOKEN.finditer(text)]


def fake_logprob(token: str) -> float:
    """The fake model's log-probability of a token (after any context): deterministic."""
    return -(0.5 + (sum(map(ord, token)) % 17) / 4)


def fake_is_top(token: str) -> bool:
    """Whether the fake model's most likely token at that position is this one."""
    return sum(map(ord, token)) % 3 == 0


def sum_answer(messages: list[dict[str, Any]]) -> str:
    """The default: answers the arithmetic questions of tests.e2e.helpers.arithmetic_items."""
    m = _SUM.search(messages[-1]["content"]) if messages else None
    return str(int(m[1]) + int(m[2])) if m else "ok"


@dataclass(frozen=True)
class Reply:
    status: int = 200
    content: str | None = None  # None: what `answer` says
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # slow: wait before answering
    hang: bool = False  # never answer (until the provider stops)
    raw_body: bytes | None = None  # sent as is (malformed JSON, an HTML error page...)
    usage: bool = True


@dataclass(frozen=True)
class Recorded:
    n: int
    at: float  # time.monotonic()
    headers: dict[str, str]
    body: dict[str, Any] | None
    status: int


Script = Callable[[int, dict[str, Any]], Reply | None]


class FakeProvider:
    def __init__(self, answer: Callable[[list[dict[str, Any]]], str] = sum_answer) -> None:
        self.answer = answer
        self.script: Script | None = None
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._limit: tuple[float, float] | None = None  # (per second, retry-after)
        self._window: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0  # most requests being answered at once
        self.prompt_logprobs = True  # False: /completions answers without logprobs
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                provider._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()  # releases hung handlers
        self._server.shutdown()
        self._server.server_close()

    def spec(self, model: str = "fake-model", **options: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"openai:{model}@{self.url}" + (f"?{query}" if query else "")

    def rate_limit(self, per_second: float | None, retry_after: float = 1.0) -> None:
        with self._lock:
            self._limit = (per_second, retry_after) if per_second else None
            self._window = []

    def statuses(self) -> list[int]:
        with self._lock:
            return [r.status for r in self.requests]

    def count(self, status: int | None = None) -> int:
        return sum(1 for s in self.statuses() if status is None or s == status)

    # ---- serving

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        answered = threading.Event()

        def done() -> None:
            # counted before the reply is written: a client can send its next request the
            # moment it reads this one, before this thread would get back here
            if not answered.is_set():
                answered.set()
                with self._lock:
                    self.in_flight -= 1

        try:
            self._serve(h, done)
        finally:
            done()

    def _serve(self, h: BaseHTTPRequestHandler, done: Callable[[], None]) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with self._lock:
            n = len(self.requests) + 1
            reply = self._rate_limited()
        if reply is None and self.script is not None:
            reply = self.script(n, body or {})
        reply = reply or Reply()
        path = h.path.rstrip("/")
        route = (
            "chat"
            if path.endswith("/chat/completions")
            else "text"
            if path.endswith("/completions")
            else None
        )
        if route is None:
            reply = Reply(status=404, raw_body=b'{"error": {"message": "no such route"}}')
        with self._lock:
            self.requests.append(Recorded(n, time.monotonic(), dict(h.headers), body, reply.status))
        if reply.hang:
            self._stopping.wait()
            return
        if reply.delay_s:
            self._stopping.wait(reply.delay_s)
        if reply.raw_body is not None:
            payload = reply.raw_body
        elif route == "text" and reply.status == 200:
            payload = self._text_payload(body or {}, reply)
        else:
            payload = self._payload(reply, body or {})
        done()
        try:
            h.send_response(reply.status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(payload)))
            for k, v in reply.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(payload)
        except OSError:  # the client gave up (timeout) meanwhile
            pass

    def _rate_limited(self) -> Reply | None:
        if self._limit is None:
            return None
        per_second, retry_after = self._limit
        now = time.monotonic()
        self._window = [t for t in self._window if now - t < 1.0]
        if len(self._window) >= per_second:
            return Reply(
                status=429,
                headers={"Retry-After": f"{retry_after:g}"},
                raw_body=b'{"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}}',
            )
        self._window.append(now)
        return None

    def _payload(self, reply: Reply, body: dict[str, Any]) -> bytes:
        if reply.status != 200:
            message = {429: "Rate limit reached", 500: "Internal error", 503: "Overloaded"}.get(
                reply.status, "error"
            )
            return json.dumps({"error": {"message": message, "code": reply.status}}).encode()
        messages = body.get("messages") or []
        text = reply.content if reply.content is not None else self.answer(messages)
        data: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
        }
        if reply.usage:
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
            data["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(text.split()),
                "total_tokens": prompt_tokens + len(text.split()),
            }
        return json.dumps(data).encode()

    def _text_payload(self, body: dict[str, Any], reply: Reply) -> bytes:
        """A completions answer echoing the prompt with its log-probabilities (max_tokens 0:
        nothing generated), the first token's None as vLLM's; or, without prompt_logprobs,
        an answer whose logprobs are null. Without echo, a raw prompt's continuation: what
        `answer` says of the prompt as one user message (or the reply's content)."""
        prompt = str(body.get("prompt") or "")
        tokens = fake_tokens(prompt)
        if body.get("echo"):
            text = prompt
        elif int(body.get("max_tokens") or 0) > 0:
            text = (
                reply.content
                if reply.content is not None
                else self.answer([{"role": "user", "content": prompt}])
            )
        else:
            text = ""
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length"}
        if self.prompt_logprobs and body.get("echo") and body.get("logprobs") is not None:
            values = [None if i == 0 else fake_logprob(t) for i, (t, _) in enumerate(tokens)]
            choice["logprobs"] = {
                "tokens": [t for t, _ in tokens],
                "token_logprobs": values,
                "top_logprobs": [
                    None if v is None else {t: v} if fake_is_top(t) else {"<other>": v + 0.25}
                    for (t, _), v in zip(tokens, values, strict=True)
                ],
                "text_offset": [o for _, o in tokens],
            }
        else:
            choice["logprobs"] = None
        generated = 0 if body.get("echo") else len(text.split())
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": generated,
            "total_tokens": len(tokens) + generated,
        }
        return json.dumps(
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": body.get("model"),
                "choices": [choice],
                "usage": usage,
            }
        ).encode()


def storm(first: int = 0, seconds: float = 0.0, retry_after: float = 1.0) -> Script:
    """A 429 storm: the first `first` requests, and every request within `seconds` of the
    first one, are refused with Retry-After."""
    began: list[float] = []

    def script(n: int, body: dict[str, Any]) -> Reply | None:
        now = time.monotonic()
        began.append(now) if not began else None
        if n <= first or now - began[0] < seconds:
            return Reply(status=429, headers={"Retry-After": f"{retry_after:g}"})
        return None

    return script


def main() -> None:  # a provider to poke at by hand: python -m tests.fakes.openai_provider
    with FakeProvider() as provider:
        print(provider.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
