"""The `openai:` engine: requests to an OpenAI-compatible server under the pacing of
pacing.py, in the wire format of wire.py, configured by config.py.

Retries with exponential backoff and jitter on 429, 408, 5xx, timeouts, connection errors
and unreadable bodies; a 4xx such as 400/401/404 fails at once. After the last retry the
item fails with TransientEngineError (the pipeline retries it later through eval.retry),
a 4xx with PermanentEngineError. A response body larger than MAX_RESPONSE_BYTES fails the
request instead of filling the worker's memory.

The key is read from the mapped variable (config.key_variable) when the engine loads, sent
only in the Authorization header, and kept out of reprs, logs and error messages (an error
body that echoes it is redacted).

`generate` is blocking, as the Engine Protocol wants; requests run on an event loop of the
engine's own, in a background thread, so that calls from several threads (the runner's, a
judge grader's) share one connection pool and one set of limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from evalstream.common.messages import ChatMessage
from evalstream.common.metrics import API_CONCURRENCY, API_REQUESTS, API_RETRIES
from evalstream.common.settings import named_variable
from evalstream.worker.engines.base import (
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    TransientEngineError,
    plain_prompt,
    word_count,
)
from evalstream.worker.engines.openai.config import OpenAIConfig, key_variable
from evalstream.worker.engines.openai.pacing import (
    AdaptiveLimit,
    LearnedLimits,
    LimitReading,
    Reservation,
    TokenBucket,
    backoff_delay,
    rate_buckets,
    retry_after_seconds,
)
from evalstream.worker.engines.openai.wire import (
    BearerAuth,
    parse_completion,
    parse_text_completion,
    read_capped,
    request_body,
    request_costs,
    text_request_body,
)

log = logging.getLogger("evalstream.worker.openai")

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})
OVERLOAD_STATUSES = frozenset({429, 503, 529})  # the server asks for less traffic
MAX_ERROR_BODY = 300


@dataclass(frozen=True)
class _Retry:
    reason: str  # metric label: rate_limited, server_error, timeout, connection_error, malformed
    detail: str
    retry_after: float | None = None


class _Gate:
    """In-flight requests under the adaptive limit, and the pause a Retry-After asks for.
    Lives on the engine's event loop only."""

    def __init__(self, limit: AdaptiveLimit, clock: Callable[[], float]) -> None:
        self.limit, self.clock = limit, clock
        self.in_flight = 0
        self.paused_until = 0.0
        self._changed = asyncio.Condition()

    async def enter(self) -> int:
        """Waits for a free slot; returns the epoch the request is sent in."""
        while True:
            pause = self.paused_until - self.clock()
            if pause > 0:
                await asyncio.sleep(pause)
                continue
            async with self._changed:
                if self.paused_until > self.clock():
                    continue
                if self.in_flight < self.limit.allowed:
                    self.in_flight += 1
                    return self.limit.epoch
                await self._changed.wait()

    async def leave(self) -> None:
        async with self._changed:
            self.in_flight -= 1
            self._changed.notify_all()

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, self.clock() + seconds)


class OpenAIEngine:
    device = "api"
    cacheable = True  # greedy answers are cached like any model's: a repeated run costs nothing
    thread_safe = True  # generate() may be called from several threads at once
    schedules_itself = True  # takes a whole round of requests at once; paces them itself

    def __init__(
        self,
        config: OpenAIConfig,
        *,
        name: str | None = None,
        key_rules: str = "",
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.name = name or f"openai:{config.model}@{config.base_url}"
        self.revision = f"{config.model}@{config.base_url}"
        self._clock = clock
        self._rng = rng or random.Random()
        # the operator's mapping decides which variable, if any, holds this endpoint's key
        self.key_env = key_variable(key_rules, config.base_url) or config.key_env
        key = named_variable(self.key_env, env) if self.key_env else None
        self._key = key  # only for redaction; the client holds it in its auth
        self.limit = AdaptiveLimit(maximum=config.concurrency)
        # overloads: 429/503/529 answers; paced_refusals: 429s that re-synced the learned
        # pacing instead of cutting the concurrency limit
        self.stats: dict[str, int] = {"requests": 0, "retries": 0, "overloads": 0, "paced_refusals": 0}
        self.learned = LearnedLimits()  # the provider's limits, from its x-ratelimit-* headers
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"engine-{self.revision}", daemon=True
        )
        self._thread.start()
        self._gate: _Gate
        self._buckets: list[TokenBucket]
        self._client: httpx.AsyncClient
        self._call(self._setup(key))
        API_CONCURRENCY.labels(model=self.revision).set(self.limit.allowed)

    def __repr__(self) -> str:
        return f"OpenAIEngine({self.revision!r}, key_env={self.key_env!r})"

    async def _setup(self, key: str | None) -> None:
        # made on the engine's loop, which the client's connections and the gate belong to
        c = self.config
        self._gate = _Gate(self.limit, self._clock)
        self._answered = asyncio.Event()  # set by the first request's outcome, whatever it is
        self._probe_sent = False
        self._buckets = rate_buckets(c.rps, c.rpm, self._clock())
        self._client = httpx.AsyncClient(
            base_url=c.base_url + "/",
            auth=BearerAuth(key) if key else None,
            timeout=httpx.Timeout(c.timeout_s, connect=min(c.timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=c.concurrency, max_keepalive_connections=c.concurrency),
            headers={"User-Agent": "evalstream"},
        )

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # ---- Engine Protocol

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        return plain_prompt(messages)  # what is sent is the message list: this renders it stably

    def count_tokens(self, text: str) -> int:
        return word_count(text)

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        if not requests:
            return []
        return self._call(self._generate_all(requests))

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        """Through the completions endpoint's prompt log-probabilities (scoring.py)."""
        from evalstream.worker.engines.openai.scoring import loglikelihood_all

        return self._call(loglikelihood_all(self, requests)) if requests else []

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        from evalstream.worker.engines.openai.scoring import rolling_all

        return self._call(rolling_all(self, requests)) if requests else []

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._client.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    # ---- requests

    async def _generate_all(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        return list(await asyncio.gather(*(self._complete(r) for r in requests)))

    async def _complete(self, request: GenRequest) -> GenOutput | EngineError:
        if request.prompt is not None:  # a raw prompt: the completions endpoint, no chat template
            body = text_request_body(self.config.model, request.prompt, request.params)
            path, parse = "completions", parse_text_completion
        else:
            body = request_body(self.config.model, request.messages, request.params)
            path, parse = "chat/completions", parse_completion
        started = self._clock()
        outcome = await self._request(body, path, parse)
        if isinstance(outcome, EngineError):
            return outcome
        completion, attempts = outcome
        return GenOutput(
            text=completion.text,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            latency_ms=(self._clock() - started) * 1000,
            extra={"finish_reason": completion.finish_reason or "", "http_attempts": str(attempts)},
        )

    async def _request(
        self, body: dict[str, Any], path: str, parse: Callable[[bytes], T | PermanentEngineError]
    ) -> tuple[T, int] | EngineError:
        """POSTs `body` to `path` under the engine's pacing, retrying as the module says:
        (what `parse` read of the answer, HTTP attempts) or the request's error."""
        last: _Retry | None = None
        attempts = 0
        for retry in range(self.config.max_retries + 1):
            if last is not None:
                delay = (
                    last.retry_after
                    if last.retry_after is not None
                    else backoff_delay(
                        retry - 1, self.config.backoff_base_s, self.config.backoff_cap_s, self._rng
                    )
                )
                if delay > self.config.max_retry_after_s:
                    break  # the server wants a long pause: let the pipeline's retry wait it out
                self.stats["retries"] += 1
                API_RETRIES.labels(model=self.revision, reason=last.reason).inc()
                await asyncio.sleep(delay)
            outcome = await self._attempt(body, path, parse)
            attempts += 1
            if isinstance(outcome, PermanentEngineError):
                return outcome
            if not isinstance(outcome, _Retry):
                return outcome, attempts
            last = outcome
        assert last is not None
        return TransientEngineError(
            self._redact(f"{self.revision}: {last.reason} after {attempts} attempt(s): {last.detail}")
        )

    async def _attempt(
        self, body: dict[str, Any], path: str, parse: Callable[[bytes], T | PermanentEngineError]
    ) -> T | _Retry | PermanentEngineError:
        if not self._answered.is_set():
            # The first request goes alone: its answer's x-ratelimit-* headers say how much
            # the provider allows before a burst of `concurrency` requests can overrun it.
            if self._probe_sent:
                await self._answered.wait()
            self._probe_sent = True
        costs = request_costs(body)
        epoch = await self._gate.enter()
        reservation: Reservation | None = None
        try:
            reservation = await self._pace(costs)
            sent_at = self._clock()
            self.stats["requests"] += 1
            try:
                async with (
                    asyncio.timeout(self.config.timeout_s),
                    self._client.stream("POST", path, json=body) as response,
                ):
                    content = await read_capped(response, self.config.max_response_bytes)
            except (TimeoutError, httpx.TimeoutException):
                return self._count(
                    _Retry("timeout", f"no complete answer within {self.config.timeout_s:g} s")
                )
            except httpx.TransportError as exc:
                return self._count(_Retry("connection_error", f"{type(exc).__name__}: {exc}"))
            if content is None:
                API_REQUESTS.labels(model=self.revision, outcome="client_error").inc()
                return PermanentEngineError(
                    f"{self.revision}: HTTP {response.status_code} with a body over "
                    f"{self.config.max_response_bytes} bytes"
                )
            paced_before = self.learned.rates()
            readings = self.learned.observe(response.headers, reservation, sent_at, self._clock())
            if self.learned.rates().keys() != paced_before.keys():
                log.info(
                    "%s: pacing at the provider's limits %s (learned)", self.revision, self.learned.rates()
                )
            return self._classify(response, content, epoch, readings, costs, parse)
        finally:
            if reservation is not None:
                self.learned.answered(reservation)
            self._answered.set()
            await self._gate.leave()

    async def _pace(self, costs: Mapping[str, float]) -> Reservation:
        """Waits for the configured rates and the learned ones; returns the request's place
        in the learned limits' reservations."""
        now = self._clock()
        wait = max((b.reserve(now) for b in self._buckets), default=0.0)
        learned_wait, reservation = self.learned.reserve(costs, now)
        wait = max(wait, learned_wait)
        if wait > 0:
            try:
                await asyncio.sleep(wait)
            except BaseException:
                self.learned.answered(reservation)  # cancelled: never sent
                raise
        return reservation

    def _classify(
        self,
        response: httpx.Response,
        content: bytes,
        epoch: int,
        readings: list[LimitReading],
        costs: Mapping[str, float],
        parse: Callable[[bytes], T | PermanentEngineError],
    ) -> T | _Retry | PermanentEngineError:
        status = response.status_code
        if 200 <= status < 300:
            try:
                completion = parse(content)
            except ValueError as exc:
                return self._count(_Retry("malformed", f"HTTP {status} with an unreadable body: {exc}"))
            self.limit.on_success()
            API_CONCURRENCY.labels(model=self.revision).set(self.limit.allowed)
            API_REQUESTS.labels(model=self.revision, outcome="ok").inc()
            return completion
        detail = f"HTTP {status}: {self._error_text(content)}"
        if status in RETRY_STATUSES:
            wait = retry_after_seconds(response.headers)
            if status in OVERLOAD_STATUSES:
                self.stats["overloads"] += 1
                if status == 429 and self.learned.refused(readings, costs):
                    # a rate limit we pace on: the learned bucket re-synced to the provider's
                    # word; fewer requests in flight would only leave its capacity unused
                    self.stats["paced_refusals"] += 1
                elif self.limit.on_overload(epoch):
                    API_CONCURRENCY.labels(model=self.revision).set(self.limit.allowed)
                    log.info(
                        "%s: HTTP %d, concurrency limit now %d", self.revision, status, self.limit.allowed
                    )
                if wait is not None and wait <= self.config.max_retry_after_s:
                    self._gate.pause(wait)
            reason = "rate_limited" if status == 429 else "server_error"
            return self._count(_Retry(reason, detail, wait))
        API_REQUESTS.labels(model=self.revision, outcome="client_error").inc()
        return PermanentEngineError(self._redact(f"{self.revision}: {detail}"))

    def _count(self, retry: _Retry) -> _Retry:
        API_REQUESTS.labels(model=self.revision, outcome=retry.reason).inc()
        return retry

    def _error_text(self, content: bytes) -> str:
        """The server's error message, short: `error.message` of a JSON body, else its start."""
        text = content.decode("utf-8", errors="replace")
        try:
            data = json.loads(text)
            message = data.get("error", {}).get("message") if isinstance(data, dict) else None
            if isinstance(message, str) and message:
                text = message
        except (ValueError, AttributeError):
            pass
        return self._redact(" ".join(text.split())[:MAX_ERROR_BODY]) or "(empty body)"

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text
