"""A rate-limited OpenAI-compatible provider that behaves like the real ones, for the API
benchmark (bench/api_limit.py) and the engine's pacing tests. Users never run it: it stands
in for DeepSeek, OpenAI or a gateway in front of vLLM.

    python -m tests.fakes.limited_provider --port 8300 --rps 10 --rpm 1000 [--tpm 0]
        [--latency-median 0.5 --latency-sigma 0.4 --per-token-s 0.002 --seed 1]

What it does, per request (POST <base>/chat/completions, or <base>/completions with a
prompt string or a list of prompts, which is charged as that many requests):

* **Limits**: token buckets checked on arrival, all of them (requests per second, requests
  per minute, tokens per minute; 0 leaves one out). Each bucket holds its limit and refills
  continuously (a per-minute bucket at limit/60 per second), as providers enforce them. A
  request costs 1 request (per prompt) and, for the tokens bucket, its prompt tokens plus
  `max_tokens`, as OpenAI counts it on admission. A request that some bucket cannot pay for
  takes nothing and is answered at once with 429, `Retry-After` (whole seconds, rounded up,
  as HTTP has it), `retry-after-ms` (exact, as OpenAI sends) and the `x-ratelimit-*` headers.
* **Headers** on every answer, as OpenAI sends them: `x-ratelimit-limit-requests`,
  `-remaining-requests`, `-reset-requests` (time until the bucket is full again, e.g.
  `120ms`, `1.5s`, `6m0s`) and the same for tokens. Where several buckets count requests,
  the one with the fewest left is reported.
* **Latency**: lognormal around `--latency-median` (sigma `--latency-sigma`), plus
  `--per-token-s` per completion token, from a seeded generator, capped at 30 s; 429s are
  immediate.
* **Answers**: "What is A + B?" (also -, *) gets the right number, anything else "ok".
* **Counts**: GET <base>/stats is a JSON object (requests by status, admissions per second,
  first and last admission, most in flight); POST <base>/stats clears it and fills the buckets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

_QUESTION = re.compile(r"What is (-?\d+) ([-+*]) (-?\d+)\?")
MAX_BODY = 1024 * 1024
MAX_LATENCY_S = 30.0


def arithmetic_answer(text: str) -> str:
    found = list(_QUESTION.finditer(text))  # the last question in the prompt (few-shot prompts)
    if not found:
        return "ok"
    m = found[-1]
    a, op, b = int(m[1]), m[2], int(m[3])
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def count_tokens(text: str) -> int:
    """About a token per 4 characters, OpenAI's rule of thumb for admission estimates."""
    return max(1, math.ceil(len(text) / 4))


def format_reset(seconds: float) -> str:
    """OpenAI's duration style: `120ms`, `1.5s`, `6m0s`, `1h2m3s`."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if minutes or hours:
        text = f"{int(minutes)}m{text}"
    if hours:
        text = f"{int(hours)}h{text}"
    return text


# --------------------------------------------------------------------------- limits (pure)


@dataclass
class Bucket:
    name: str  # "requests/s", "requests/min", "tokens/min"
    unit: str  # "requests" or "tokens"
    limit: float  # capacity
    per_s: float  # refill rate
    level: float = -1.0  # -1: full on first use
    updated: float = 0.0

    def refill(self, now: float) -> None:
        if self.level < 0:
            self.level, self.updated = self.limit, now
        self.level = min(self.limit, self.level + max(0.0, now - self.updated) * self.per_s)
        self.updated = now

    def wait_for(self, cost: float) -> float:
        """Seconds until `cost` is available (after refill). inf: never (over the limit)."""
        if cost > self.limit:
            return math.inf
        return max(0.0, (cost - self.level) / self.per_s)

    def reset_s(self) -> float:
        return (self.limit - self.level) / self.per_s


@dataclass(frozen=True)
class Decision:
    admitted: bool
    retry_after_s: float  # 0 when admitted
    headers: dict[str, str]


@dataclass
class RateLimits:
    """The provider's buckets. `admit` is called on arrival, under the server's lock."""

    rps: float = 10.0
    rpm: float = 1000.0
    tpm: float = 0.0
    buckets: list[Bucket] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rps > 0:
            self.buckets.append(Bucket("requests/s", "requests", self.rps, self.rps))
        if self.rpm > 0:
            self.buckets.append(Bucket("requests/min", "requests", self.rpm, self.rpm / 60))
        if self.tpm > 0:
            self.buckets.append(Bucket("tokens/min", "tokens", self.tpm, self.tpm / 60))

    @property
    def requests_per_s(self) -> float:
        """The sustained request rate the buckets allow (the tightest)."""
        rates = [b.per_s for b in self.buckets if b.unit == "requests"]
        return min(rates) if rates else math.inf

    def admit(self, requests: int, tokens: int, now: float) -> Decision:
        costs = {"requests": float(requests), "tokens": float(tokens)}
        for b in self.buckets:
            b.refill(now)
        wait = max((b.wait_for(costs[b.unit]) for b in self.buckets), default=0.0)
        admitted = wait == 0.0
        if admitted:
            for b in self.buckets:
                b.level -= costs[b.unit]
        return Decision(admitted, 0.0 if admitted else wait, self._headers())

    def _headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for unit in ("requests", "tokens"):
            mine = [b for b in self.buckets if b.unit == unit]
            if not mine:
                continue
            tight = min(mine, key=lambda b: b.level)
            out[f"x-ratelimit-limit-{unit}"] = str(int(tight.limit))
            out[f"x-ratelimit-remaining-{unit}"] = str(max(0, math.floor(tight.level)))
            out[f"x-ratelimit-reset-{unit}"] = format_reset(tight.reset_s())
        return out


# --------------------------------------------------------------------------- the server


@dataclass
class ProviderConfig:
    rps: float = 10.0
    rpm: float = 1000.0
    tpm: float = 0.0
    latency_median_s: float = 0.5
    latency_sigma: float = 0.4
    per_token_s: float = 0.002
    seed: int = 1


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class LimitedProvider:
    """The ASGI app (served by uvicorn); `serve_in_thread` runs it for tests."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()
        self.reset_stats()

    def reset_stats(self) -> None:
        """Counts cleared, buckets full again: a fresh provider for the next measurement."""
        with self._lock:
            self.limits = RateLimits(self.config.rps, self.config.rpm, self.config.tpm)
            self.statuses: Counter[int] = Counter()
            self.admitted_at: list[float] = []  # monotonic times of admitted requests (per prompt)
            self.in_flight = 0
            self.max_in_flight = 0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            times = list(self.admitted_at)
            first, last = (times[0], times[-1]) if times else (None, None)
            per_second = Counter(int(t - times[0]) for t in times) if times else Counter()
            return {
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "requests": sum(self.statuses.values()),
                "rate_limited": self.statuses[429],
                "admitted_prompts": len(times),
                "first_admitted": first,
                "last_admitted": last,
                "admitted_per_second": [per_second[i] for i in range(max(per_second, default=-1) + 1)],
                "max_in_flight": self.max_in_flight,
                "limits": {"rps": self.config.rps, "rpm": self.config.rpm, "tpm": self.config.tpm},
                "sustained_requests_per_s": self.limits.requests_per_s,
            }

    def latency(self, completion_tokens: int) -> float:
        c = self.config
        with self._lock:
            base = c.latency_median_s * math.exp(self._rng.gauss(0.0, c.latency_sigma))
        return min(MAX_LATENCY_S, base + c.per_token_s * completion_tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        if path.endswith("/stats"):
            if method == "POST":
                self.reset_stats()
            await _reply(send, 200, self.stats())
            return
        if path.endswith("/models"):
            await _reply(send, 200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            return
        if method != "POST" or not (path.endswith("/chat/completions") or path.endswith("/completions")):
            await _reply(send, 404, {"error": {"message": f"no route {method} {path}"}})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if len(raw) > MAX_BODY:
                await _reply(send, 413, {"error": {"message": "body too large"}})
                return
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            await _reply(send, 400, {"error": {"message": "malformed JSON body"}})
            return
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._complete(path.endswith("/chat/completions"), body, send)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _complete(self, chat: bool, body: dict[str, Any], send: Send) -> None:
        if chat:
            messages = body.get("messages") or []
            prompts = ["\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))]
        else:
            raw_prompt = body.get("prompt", "")
            prompts = [str(p) for p in raw_prompt] if isinstance(raw_prompt, list) else [str(raw_prompt)]
        max_tokens = int(body.get("max_tokens") or 16)
        tokens = sum(count_tokens(p) for p in prompts) + max_tokens * len(prompts)
        with self._lock:
            now = time.monotonic()
            decision = self.limits.admit(len(prompts), tokens, now)
            self.statuses[200 if decision.admitted else 429] += 1
            if decision.admitted:
                self.admitted_at.extend([now] * len(prompts))
        if not decision.admitted:
            wait = decision.retry_after_s
            headers = {
                **decision.headers,
                "retry-after": str(max(1, math.ceil(wait))) if math.isfinite(wait) else "60",
                "retry-after-ms": str(math.ceil(wait * 1000)) if math.isfinite(wait) else "60000",
            }
            await _reply(
                send,
                429,
                {"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded", "code": 429}},
                headers,
            )
            return
        answers = [arithmetic_answer(p) for p in prompts]
        completion_tokens = sum(count_tokens(a) for a in answers)
        await asyncio.sleep(self.latency(completion_tokens))
        prompt_tokens = sum(count_tokens(p) for p in prompts)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if chat:
            choices: list[dict[str, Any]] = [
                {"index": 0, "message": {"role": "assistant", "content": answers[0]}, "finish_reason": "stop"}
            ]
        else:
            choices = [
                {"index": i, "text": a, "finish_reason": "stop", "logprobs": None}
                for i, a in enumerate(answers)
            ]
        payload = {
            "id": "cmpl-fake",
            "object": "chat.completion" if chat else "text_completion",
            "model": body.get("model"),
            "choices": choices,
            "usage": usage,
        }
        await _reply(send, 200, payload, decision.headers)


async def _reply(
    send: Send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    data = json.dumps(payload).encode()
    pairs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    pairs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": pairs})
    await send({"type": "http.response.body", "body": data})


class Running:
    """A provider served by uvicorn on 127.0.0.1 in a thread of its own (tests)."""

    def __init__(self, config: ProviderConfig) -> None:
        import uvicorn

        self.app = LimitedProvider(config)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        )
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))

    def __enter__(self) -> Running:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake provider did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rps", type=float, default=10.0, help="requests per second (0: none)")
    ap.add_argument("--rpm", type=float, default=1000.0, help="requests per minute (0: none)")
    ap.add_argument("--tpm", type=float, default=0.0, help="tokens per minute (0: none)")
    ap.add_argument("--latency-median", type=float, default=0.5, help="seconds")
    ap.add_argument("--latency-sigma", type=float, default=0.4, help="of the latency's logarithm")
    ap.add_argument("--per-token-s", type=float, default=0.002, help="seconds per completion token")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import uvicorn

    config = ProviderConfig(
        args.rps, args.rpm, args.tpm, args.latency_median, args.latency_sigma, args.per_token_s, args.seed
    )
    uvicorn.run(
        LimitedProvider(config),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
