"""`openai:<model>@<base_url>[?options]`: any OpenAI-compatible chat-completions server
(DeepSeek, OpenAI, vLLM, SGLang, TGI, llama.cpp's server). A raw prompt (GenRequest.prompt,
lm-eval tasks) goes to the completions endpoint instead (`POST <base>/completions` with
`prompt`), continued as it is: no chat template on either side.

    openai:deepseek-chat@https://api.deepseek.com/v1?rps=5&rpm=200&concurrency=8

`<base_url>` may be a provider preset's name (libs/common/evalstream/common/providers.py):
`openai:deepseek-chat@deepseek` is DeepSeek's API with its documented limits (10 requests/s,
1,000/min, 30 s timeout, 3 retries, key in DEEPSEEK_API_KEY).

Options, from the SPEC's query string (parsed and bounded by evalstream.common.specs), else
the preset's, else the worker's environment, else the default:

    concurrency  OPENAI_CONCURRENCY  8    most requests in flight: the adaptive limit's ceiling (<= 64)
    rps          OPENAI_RPS          0    requests per second (0: unlimited)
    rpm          OPENAI_RPM          0    requests per minute (0: unlimited)
    timeout      OPENAI_TIMEOUT_S    60   seconds for one HTTP request, connecting to last byte (<= 120)
    retries      OPENAI_MAX_RETRIES  6    retries of one request before the item fails (<= 8)

Options written in the SPEC are part of it, and so of the answer-cache key; set them in the
worker's environment instead to share cached answers between runs with different limits.

API keys: a job never chooses which variable a worker reads. The operator maps endpoints to
variables in WORKER_API_KEYS, comma-separated `<base-url pattern>=<VARIABLE>` pairs, e.g.

    WORKER_API_KEYS="https://api.deepseek.com/*=DEEPSEEK_API_KEY,http://10.0.0.5:8000/*=VLLM_KEY"

The first pattern (shell-style, matched on the parsed base URL plus a trailing "/") that
matches decides the variable; else a provider preset's own variable, for the preset's own URL;
an endpoint neither covers gets no key at all. Which
endpoints a group may call at all is its allow-list's business (WORKER_MODEL, e.g.
`openai:*@https://api.deepseek.com/*`). A response body larger than MAX_RESPONSE_BYTES fails
the request instead of filling the worker's memory.

How requests are paced:

* An adaptive concurrency limit (AIMD, as TCP's congestion window): it starts at
  `concurrency`, halves on a 429 or 503 (at most once per round of requests: the answers to
  requests sent before the cut do not cut it again) and grows back by one request per round
  of successes. A `Retry-After` (or `retry-after-ms`) pauses every new request until then.
* Token buckets for requests per second and per minute (bursts of at most one second's
  worth), reserving in arrival order.
* The provider's own limits, learned from the `x-ratelimit-limit/remaining/reset-*` headers
  of its answers (requests and tokens, as OpenAI, Azure, Groq and gateways send them): a
  bucket per reported limit, its refill rate bracketed by the readings, requests paced at
  the bracket's lower end once it is narrow, and the local balance never above what the
  provider last reported less what was sent since (LearnedBucket). A 429 that such a bucket
  explains re-syncs it instead of cutting the concurrency limit. An engine's first request
  goes alone, so that its answer's headers are known before a burst of `concurrency`
  requests can overrun a provider that allows fewer at once. No configuration needed: a
  bare `openai:<model>@<url>` runs at the provider's limit with few 429s. Several workers
  sharing one key each pace at the whole limit: give them a share each with `rps`/`rpm`
  (OPENAI_RPS/OPENAI_RPM), which apply on top of the learned limits.
* Retries with exponential backoff and jitter on 429, 408, 5xx, timeouts, connection errors
  and unreadable bodies; a 4xx such as 400/401/404 fails at once. After the last retry the
  item fails with TransientEngineError (the pipeline retries it later through eval.retry),
  a 4xx with PermanentEngineError.

The key is read from the mapped variable when the engine loads, sent only in the
Authorization header, and kept out of reprs, logs and error messages (an error body that
echoes it is redacted). Token usage comes from the response's `usage`; a server that sends
none reports 0 completion tokens.

`generate` is blocking, as the Engine Protocol wants; requests run on an event loop of the
engine's own, in a background thread, so that calls from several threads (the runner's, a
judge grader's) share one connection pool and one set of limits.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, TypeVar

import httpx

from evalstream.common import providers
from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.common.metrics import API_CONCURRENCY, API_REQUESTS, API_RETRIES
from evalstream.common.settings import OpenAISettings, named_variable
from evalstream.common.specs import OPENAI_OPTIONS, ModelSpec, SpecError, parse_model_spec
from evalstream.worker.engines.base import (
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    TransientEngineError,
)
from evalstream.worker.engines.null import plain_prompt, word_count

log = logging.getLogger("evalstream.worker.openai")

T = TypeVar("T")

MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a chat completion is a few KB; more is an error
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})
OVERLOAD_STATUSES = frozenset({429, 503, 529})  # the server asks for less traffic
MAX_ERROR_BODY = 300


class OpenAIConfigError(ValueError):
    """A bad `openai:` SPEC, option or WORKER_API_KEYS entry."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class OpenAIConfig:
    model: str
    base_url: str  # up to and including the API version, e.g. https://api.deepseek.com/v1
    concurrency: int = OpenAISettings.openai_concurrency
    rps: float = OpenAISettings.openai_rps
    rpm: float = OpenAISettings.openai_rpm
    timeout_s: float = OpenAISettings.openai_timeout_s
    max_retries: int = OpenAISettings.openai_max_retries
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    max_retry_after_s: float = 120.0  # a longer Retry-After fails the item now (eval.retry waits)
    max_response_bytes: int = MAX_RESPONSE_BYTES
    # A provider preset's key variable (providers.py: code, never a job's choice), used for the
    # preset's own base URL when WORKER_API_KEYS maps none.
    key_env: str | None = None


def openai_config(spec: ModelSpec, env: Mapping[str, str] | None = None) -> OpenAIConfig:
    """The engine's configuration for a parsed `openai:` SPEC: its options (bounded by the
    parser), else its provider preset's, else the operator's (OPENAI_* settings, read from
    `env`, default the process environment)."""
    if spec.scheme != "openai":
        raise OpenAIConfigError(f"not an openai: SPEC: {spec.text!r}")
    try:
        operator = OpenAISettings.from_env(env)
    except ValueError as exc:
        raise OpenAIConfigError(f"worker setting: {exc}") from None
    preset = providers.PRESETS[spec.preset] if spec.preset else None
    preset_values = preset.options() if preset else {}
    values: dict[str, Any] = {}
    for bound in OPENAI_OPTIONS.values():
        value = getattr(spec.options, bound.field)
        if value is None:
            value = preset_values.get(bound.field)
        if value is None:
            value = getattr(operator, bound.env.lower())
        values[bound.field] = bound.kind(value)
    config = OpenAIConfig(
        model=spec.target, base_url=spec.base_url, key_env=preset.key_env if preset else None, **values
    )
    problems = [f"{name} must be >= {low}" for name, low in _MINIMUMS.items() if getattr(config, name) < low]
    if problems:
        raise OpenAIConfigError("; ".join(problems))
    return config


_MINIMUMS = {"concurrency": 1, "rps": 0, "rpm": 0, "timeout_s": 0.001, "max_retries": 0}


def parse_target(target: str, env: Mapping[str, str] | None = None) -> OpenAIConfig:
    """`<model>@<base_url>[?options]` (what follows "openai:") -> config. Raises OpenAIConfigError."""
    try:
        parsed = parse_model_spec(f"openai:{target}")
    except SpecError as exc:
        raise OpenAIConfigError(str(exc)) from None
    return openai_config(parsed, env)


def parse_key_rules(rules: str) -> list[tuple[str, str]]:
    """WORKER_API_KEYS -> [(base-url pattern, variable)]. Raises OpenAIConfigError."""
    out: list[tuple[str, str]] = []
    for entry in (e.strip() for e in rules.split(",")):
        if not entry:
            continue
        pattern, eq, variable = entry.rpartition("=")
        if not eq or not pattern.strip() or not _ENV_NAME.fullmatch(variable.strip()):
            raise OpenAIConfigError(
                f"WORKER_API_KEYS entry {entry!r}: expected <base-url pattern>=<VARIABLE_NAME>"
            )
        out.append((pattern.strip(), variable.strip()))
    return out


def key_variable(rules: str, base_url: str) -> str | None:
    """The variable holding the key for `base_url` per WORKER_API_KEYS, or None: no key."""
    for pattern, variable in parse_key_rules(rules):
        if fnmatchcase(base_url + "/", pattern) or fnmatchcase(base_url, pattern):
            return variable
    return None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --------------------------------------------------------------------------- pacing (pure)


@dataclass
class AdaptiveLimit:
    """AIMD concurrency limit. `epoch` counts the cuts: a request remembers the epoch it was
    sent in, and only an overload answer from the current epoch cuts again, so that a burst
    of 429s from one round of requests halves the limit once, not once per request."""

    maximum: int
    minimum: int = 1
    decrease: float = 0.5
    value: float = 0.0
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {self.minimum}, {self.maximum}")
        self.value = float(self.maximum) if self.value <= 0 else self.value

    @property
    def allowed(self) -> int:
        return max(self.minimum, int(self.value))

    def on_success(self) -> None:
        """+1/limit per success: the limit grows by one per full round of successes."""
        self.value = min(float(self.maximum), self.value + 1.0 / self.value)

    def on_overload(self, epoch: int) -> bool:
        """Multiplicative decrease, once per epoch. Returns whether the limit was cut."""
        if epoch != self.epoch:
            return False
        self.value = max(float(self.minimum), self.value * self.decrease)
        self.epoch += 1
        return True


class TokenBucket:
    """`rate` tokens per second, at most `capacity` stored. `reserve` takes a token now and
    says how long to wait until it is really there: the balance may go negative, so that
    waiters are served in arrival order without polling."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if rate <= 0 or capacity < 1:
            raise ValueError(f"need rate > 0 and capacity >= 1, got {rate}, {capacity}")
        self.rate, self.capacity = rate, capacity
        self.tokens, self.updated = capacity, now

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def reserve(self, now: float, cost: float = 1.0) -> float:
        self.refill(now)
        self.tokens -= cost
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def rate_buckets(rps: float, rpm: float, now: float) -> list[TokenBucket]:
    """A bucket per configured rate; each allows a burst of one second's worth (at least one
    request), since providers commonly enforce per-minute limits over shorter windows."""
    per_second = [r for r in (rps, rpm / 60.0) if r > 0]
    return [TokenBucket(r, max(1.0, r), now) for r in per_second]


_DURATION = re.compile(
    r"(?:(?P<h>\d{1,6}(?:\.\d{1,6})?)h)?(?:(?P<m>\d{1,6}(?:\.\d{1,6})?)m(?!s))?"
    r"(?:(?P<s>\d{1,9}(?:\.\d{1,9})?)s)?(?:(?P<ms>\d{1,9}(?:\.\d{1,9})?)ms)?"
)
_NUMBER = re.compile(r"\d{1,12}(?:\.\d{1,9})?")
MAX_LEARNED_RATE = 1e7  # per second: anything larger is a misreading, not a limit
MAX_LEARNED_LIMIT = 1e10
MAX_LEARNED_BUCKETS = 4  # per unit: a server that reports a new limit each time cannot grow this


def parse_duration(text: str) -> float | None:
    """An `x-ratelimit-reset-*` value in seconds: OpenAI's `1s`, `6m0s`, `120ms`, `1h2m3.5s`,
    or plain seconds (`0.25`). None when absent or unreadable."""
    text = text.strip()[:40]
    if _NUMBER.fullmatch(text):
        return float(text)
    m = _DURATION.fullmatch(text)
    if not text or m is None:
        return None
    parts = {k: float(v) for k, v in m.groupdict().items() if v is not None}
    return parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0) + parts.get("ms", 0) / 1000


@dataclass(frozen=True)
class LimitReading:
    """One bucket as the provider reported it with an answer: `x-ratelimit-limit-<unit>`,
    `-remaining-<unit>` (what was left after this request) and `-reset-<unit>` (seconds until
    the bucket is full again)."""

    unit: str  # "requests" or "tokens"
    limit: float
    remaining: float
    reset_s: float


def rate_limit_readings(headers: Mapping[str, str]) -> list[LimitReading]:
    """The `x-ratelimit-*` buckets in a response's headers (OpenAI's names, also sent by
    vLLM gateways, Azure, Groq, Together...); unreadable or implausible ones are left out."""
    lowered = {k.lower(): v for k, v in headers.items()}
    out: list[LimitReading] = []
    for unit in ("requests", "tokens"):
        limit, remaining = (
            lowered.get(f"x-ratelimit-{w}-{unit}", "").strip() for w in ("limit", "remaining")
        )
        reset = parse_duration(lowered.get(f"x-ratelimit-reset-{unit}", ""))
        if not (_NUMBER.fullmatch(limit) and _NUMBER.fullmatch(remaining)) or reset is None:
            continue
        lim, rem = float(limit), float(remaining)
        if 1 <= lim <= MAX_LEARNED_LIMIT and 0 <= rem <= lim:
            out.append(LimitReading(unit, lim, rem, reset))
    return out


class LearnedBucket:
    """A provider's bucket as inferred from its headers, to pace requests below it without
    being told the limit.

    The refill rate is bracketed by every reading: the provider reports `remaining` as a
    whole number (the level was in [remaining, remaining + 1)) and `reset` as the time to
    refill `limit - level`, so rate lies in ((spent - 1) / reset, spent / reset] with
    spent = limit - remaining. The brackets of all readings are intersected; once the
    bracket is narrower than CONFIDENT, requests are paced just under its lower end (never
    faster than the provider refills). Each reading also caps the local balance at what the
    provider had then, less what was sent since: the client never believes in more
    capacity than the provider last reported."""

    CONFIDENT = 1.1  # pace once high / low <= this
    # Paced this far under the provider's rate: its clock starts a request's refill when the
    # request arrives, ours when it leaves; the slack absorbs that jitter.
    HEADROOM = 0.98

    def __init__(self, unit: str, limit: float) -> None:
        self.unit, self.limit = unit, limit
        self.low, self.high = 0.0, math.inf
        self.confident = False
        self.bucket: TokenBucket | None = None  # set once confident

    @property
    def rate(self) -> float | None:
        """The pacing rate: the bracket's lower end once it is narrow; before that its upper
        end (faster than the provider refills, so that its bucket drains and the readings
        near empty narrow the bracket, while the balance still follows what it reports);
        None before any reading."""
        if self.confident:
            return self.low * self.HEADROOM
        return self.high if math.isfinite(self.high) else None

    def observe(self, reading: LimitReading, spent_since: float, elapsed: float, now: float) -> None:
        """`spent_since`: what this client reserved after the request that got `reading`;
        `elapsed`: seconds since that request was sent."""
        spent = reading.limit - reading.remaining
        if reading.reset_s > 0 and spent >= 1:
            low = min(MAX_LEARNED_RATE, (spent - 1) / reading.reset_s)
            high = min(MAX_LEARNED_RATE, spent / reading.reset_s)
            if low > self.high or high < self.low:  # the provider changed its limit: start over
                self.low, self.high, self.confident = low, high, False
            else:
                self.low, self.high = max(self.low, low), min(self.high, high)
            self.confident = self.confident or (self.low > 0 and self.high <= self.low * self.CONFIDENT)
        rate = self.rate
        if rate is None:
            return
        if self.bucket is None:
            self.bucket = TokenBucket(rate, self.limit, now)
        self.bucket.refill(now)
        self.bucket.rate = rate
        provider_has = reading.remaining + rate * max(0.0, elapsed) - spent_since
        self.bucket.tokens = min(self.bucket.tokens, provider_has)

    def on_refused(self) -> None:
        """A 429 although paced: the estimate (or the provider's clock) ran ahead; slow down
        a little and let the readings bracket the rate again from there."""
        if self.confident:
            self.low *= 0.97


@dataclass(frozen=True)
class Reservation:
    """A request's place in what this client sent: `seq` orders reservations, `after` is the
    cumulative reservations once it was made (to count what was sent after it)."""

    seq: int
    costs: Mapping[str, float]
    after: Mapping[str, float]


class LearnedLimits:
    """The provider's buckets learned from `x-ratelimit-*` headers, one per (unit, limit)."""

    def __init__(self) -> None:
        self.buckets: dict[tuple[str, float], LearnedBucket] = {}
        self.reserved = {"requests": 0.0, "tokens": 0.0}  # cumulative, to count what was sent since
        self.unanswered: dict[int, Reservation] = {}  # at most the engine's concurrency
        self._seq = 0

    def reserve(self, costs: Mapping[str, float], now: float) -> tuple[float, Reservation]:
        """Takes `costs` ({"requests": 1, "tokens": n}) from every paced bucket: returns the
        wait and the request's reservation, unanswered until `answered`."""
        wait = 0.0
        for b in self.buckets.values():
            if b.bucket is not None and b.rate is not None:
                wait = max(wait, b.bucket.reserve(now, costs.get(b.unit, 0.0)))
        for unit, cost in costs.items():
            self.reserved[unit] = self.reserved.get(unit, 0.0) + cost
        self._seq += 1
        reservation = Reservation(self._seq, dict(costs), dict(self.reserved))
        self.unanswered[reservation.seq] = reservation
        return wait, reservation

    def answered(self, reservation: Reservation) -> None:
        """Its answer (or failure) is in, and its reading, if any, observed."""
        self.unanswered.pop(reservation.seq, None)

    def observe(
        self, headers: Mapping[str, str], reservation: Reservation, sent_at: float, now: float
    ) -> list[LimitReading]:
        """Requests in flight together reach the provider in any order, so the reading may
        predate any earlier request still unanswered: those count as spent after it, as do
        all later ones. An earlier request already answered had its own reading observed,
        and the balance never rises on a reading: it needs no counting."""
        readings = rate_limit_readings(headers)
        for r in readings:
            key = (r.unit, r.limit)
            bucket = self.buckets.get(key)
            if bucket is None:
                if sum(1 for u, _ in self.buckets if u == r.unit) >= MAX_LEARNED_BUCKETS:
                    del self.buckets[next(k for k in self.buckets if k[0] == r.unit)]
                bucket = self.buckets[key] = LearnedBucket(r.unit, r.limit)
            spent_since = self.reserved.get(r.unit, 0.0) - reservation.after.get(r.unit, 0.0)
            spent_since += sum(
                e.costs.get(r.unit, 0.0) for e in self.unanswered.values() if e.seq < reservation.seq
            )
            bucket.observe(r, spent_since, now - sent_at, now)
        return readings

    def refused(self, readings: list[LimitReading], costs: Mapping[str, float]) -> bool:
        """A 429 whose headers show a bucket this client paces on without room for the
        request: the answer is pacing, not fewer requests in flight. Returns whether that
        was the case."""
        paced = False
        for r in readings:
            b = self.buckets.get((r.unit, r.limit))
            if b is not None and b.rate is not None and r.remaining < costs.get(r.unit, 1.0):
                b.on_refused()
                paced = True
        return paced

    def rates(self) -> dict[str, float]:
        """Rates paced at, once confident, per bucket, e.g. {"requests/10": 9.9}."""
        return {f"{u}/{lim:g}": b.low * b.HEADROOM for (u, lim), b in self.buckets.items() if b.confident}


def backoff_delay(retry: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half of min(cap, base * 2^retry) for sure,
    plus up to as much again at random, so that clients retrying together spread out but
    never retry at once."""
    ceiling = min(cap, base * 2.0**retry)
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait per `retry-after-ms` (OpenAI) or `Retry-After` (seconds or an HTTP
    date; `now` is unix time), or None when absent or unreadable."""
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = (lowered.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# --------------------------------------------------------------------------- responses


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


def parse_completion(body: bytes) -> Completion:
    """The first choice of a chat-completions response. Raises ValueError if the body is
    not one (malformed JSON, an error object, no choices)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("no choices in the response")
    choice = data["choices"][0]
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message content is a {type(content).__name__}, not text")
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    try:
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        raise ValueError(f"unreadable usage {usage!r}") from None
    return Completion(content or "", prompt_tokens, completion_tokens, choice.get("finish_reason"))


def parse_text_completion(body: bytes) -> Completion:
    """The first choice of a (text) completions response, as parse_completion reads a chat one:
    `choices[0].text`. Raises ValueError if the body is not one."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("no choices in the response")
    choice = data["choices"][0]
    text = choice.get("text") if isinstance(choice, dict) else None
    if text is not None and not isinstance(text, str):
        raise ValueError(f"completion text is a {type(text).__name__}, not text")
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    try:
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        raise ValueError(f"unreadable usage {usage!r}") from None
    return Completion(text or "", prompt_tokens, completion_tokens, choice.get("finish_reason"))


def request_costs(body: Mapping[str, Any]) -> dict[str, float]:
    """What a request takes from a provider's buckets: one request, and tokens as OpenAI
    counts them on admission (about 4 characters a token of prompt, plus max_tokens)."""
    chars = sum(len(str(m.get("content") or "")) for m in body.get("messages") or [] if isinstance(m, dict))
    chars += len(str(body.get("prompt") or ""))  # a completions request (log-likelihood scoring)
    return {"requests": 1.0, "tokens": float(math.ceil(chars / 4) + int(body.get("max_tokens") or 0))}


def request_body(model: str, messages: list[ChatMessage], params: GenerationParams) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
    }
    return {**body, **_sampling(params)}


def text_request_body(model: str, prompt: str, params: GenerationParams) -> dict[str, Any]:
    """A completions request: the raw prompt, continued as it is (no chat template)."""
    return {"model": model, "prompt": prompt, **_sampling(params)}


def _sampling(params: GenerationParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.temperature > 0:
        out["seed"] = params.seed  # honoured by OpenAI and vLLM; ignored by others
    if params.stop:
        out["stop"] = params.stop
    return out


# --------------------------------------------------------------------------- the engine


async def _read_capped(response: httpx.Response, limit: int) -> bytes | None:
    """The body, or None as soon as it grows past `limit` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class _BearerAuth(httpx.Auth):
    """Adds the key to each request; its repr never shows it."""

    def __init__(self, key: str) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._key}"
        yield request

    def __repr__(self) -> str:
        return "_BearerAuth(***)"


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
            auth=_BearerAuth(key) if key else None,
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
        """Through the completions endpoint's prompt log-probabilities (openai_scoring.py)."""
        from evalstream.worker.engines.openai_scoring import loglikelihood_all

        return self._call(loglikelihood_all(self, requests)) if requests else []

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        from evalstream.worker.engines.openai_scoring import rolling_all

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
                    content = await _read_capped(response, self.config.max_response_bytes)
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
