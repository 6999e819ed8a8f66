"""How the `openai:` engine paces its requests (pure: no I/O, clocks passed in):

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
* Retries with exponential backoff and jitter (backoff_delay), or as long as the server's
  `Retry-After` says (retry_after_seconds).
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass


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
