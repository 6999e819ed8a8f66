"""The `openai:` engine at a provider's limits: the rate-limited fake provider's buckets and
headers, the engine's limits learned from `x-ratelimit-*` headers, and the engine against
the fake (counts of requests and 429s, never wall-clock times)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator

import pytest

from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.worker.engines.base import GenOutput, GenRequest
from evalstream.worker.engines.openai import (
    MAX_LEARNED_BUCKETS,
    LearnedBucket,
    LearnedLimits,
    LimitReading,
    OpenAIConfig,
    OpenAIEngine,
    parse_duration,
    rate_limit_readings,
    request_costs,
)
from tests.fakes.limited_provider import (
    ProviderConfig,
    RateLimits,
    Running,
    arithmetic_answer,
    format_reset,
)
from tests.fakes.openai_provider import FakeProvider, Reply


def req(i: int, max_tokens: int = 16) -> GenRequest:
    return GenRequest(
        f"q{i}", [ChatMessage("user", f"What is {i} + 1?")], GenerationParams(max_tokens=max_tokens)
    )


# ---- the fake provider's limits ------------------------------------------------------------


class TestRateLimits:
    def test_burst_then_refill_per_second_bucket(self) -> None:
        limits = RateLimits(rps=5, rpm=0)
        assert [limits.admit(1, 10, 0.0).admitted for _ in range(6)] == [True] * 5 + [False]
        refused = limits.admit(1, 10, 0.0)
        assert not refused.admitted and refused.retry_after_s == pytest.approx(0.2)
        assert limits.admit(1, 10, 0.2).admitted  # one token back after 1/5 s
        assert not limits.admit(1, 10, 0.2).admitted

    def test_every_bucket_must_pay_and_a_refusal_takes_nothing(self) -> None:
        limits = RateLimits(rps=100, rpm=0, tpm=600)  # 10 tokens per second
        assert limits.admit(1, 600, 0.0).admitted
        refused = limits.admit(1, 5, 0.0)
        assert not refused.admitted and refused.retry_after_s == pytest.approx(0.5)
        assert limits.buckets[0].level == 99  # the refused request took no request token
        assert math.isinf(limits.admit(1, 601, 100.0).retry_after_s)  # over the bucket: never

    def test_headers_report_the_tightest_bucket_as_openai_does(self) -> None:
        limits = RateLimits(rps=10, rpm=1000, tpm=60_000)
        h = limits.admit(1, 100, 0.0).headers
        assert h["x-ratelimit-limit-requests"] == "10" and h["x-ratelimit-remaining-requests"] == "9"
        assert h["x-ratelimit-reset-requests"] == "100ms"
        assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("60000", "59900")
        assert h["x-ratelimit-reset-tokens"] == "100ms"
        assert limits.requests_per_s == 10

    def test_format_reset(self) -> None:
        assert [format_reset(s) for s in (0.12, 1.5, 360, 3723.5)] == ["120ms", "1.5s", "6m0s", "1h2m3.5s"]

    def test_answers(self) -> None:
        assert arithmetic_answer("What is 12 * 3?\n\nAnswer in a few words.") == "36"
        assert arithmetic_answer("What is 1 + 1? What is 9 - 10?") == "-1"
        assert arithmetic_answer("hello") == "ok"


# ---- reading a provider's headers ----------------------------------------------------------


def test_parse_duration_forms() -> None:
    assert parse_duration("120ms") == pytest.approx(0.12)
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("6m0s") == 360
    assert parse_duration("1h2m3.5s") == 3723.5
    assert parse_duration("0.25") == 0.25
    for bad in ("", "soon", "-1s", "1d", "9" * 50, "1s1s"):
        assert parse_duration(bad) is None, bad


def test_rate_limit_readings_keep_only_plausible_buckets() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "10",
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "700ms",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "2000",  # more left than the limit: not believed
        "x-ratelimit-reset-tokens": "1s",
    }
    assert rate_limit_readings(headers) == [LimitReading("requests", 10, 3, 0.7)]
    assert rate_limit_readings({"x-ratelimit-limit-requests": "-5", "x-ratelimit-remaining-requests": "0",
                                "x-ratelimit-reset-requests": "1s"}) == []  # fmt: skip
    assert rate_limit_readings({}) == []


def test_request_costs_count_prompt_and_max_tokens() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 16}
    assert request_costs(body) == {"requests": 1.0, "tokens": 26.0}


# ---- learning a bucket ---------------------------------------------------------------------


def provider_reading(limits: RateLimits, now: float) -> LimitReading:
    decision = limits.admit(1, 1, now)
    (reading,) = [r for r in rate_limit_readings(decision.headers) if r.unit == "requests"]
    return reading


class TestLearnedBucket:
    def test_rate_is_bracketed_and_paced_at_the_lower_end_once_narrow(self) -> None:
        provider = RateLimits(rps=10, rpm=0)
        bucket = LearnedBucket("requests", 10)
        rng = random.Random(3)
        now = 0.0
        for _ in range(40):  # a client sending faster than the refill: readings near empty
            now += rng.uniform(0.05, 0.1)
            bucket.observe(provider_reading(provider, now), 0, 0, now)
        assert bucket.confident
        assert bucket.low <= 10.0 < bucket.high * 1.0001
        assert bucket.low >= 9.5 and bucket.rate == bucket.low * bucket.HEADROOM  # never faster

    def test_first_reading_paces_at_the_upper_bound_until_confident(self) -> None:
        bucket = LearnedBucket("requests", 10)
        bucket.observe(LimitReading("requests", 10, 9, 0.1), 0, 0, 0.0)
        assert not bucket.confident and bucket.rate == pytest.approx(10.0)
        assert bucket.bucket is not None and bucket.bucket.tokens == 9  # what the provider has left

    def test_balance_never_above_what_the_provider_reported_less_what_was_sent(self) -> None:
        bucket = LearnedBucket("requests", 10)
        bucket.low, bucket.high, bucket.confident = 10.0, 10.0, True
        bucket.observe(LimitReading("requests", 10, 2, 0.8), spent_since=5, elapsed=0.1, now=1.0)
        assert bucket.bucket is not None and bucket.bucket.tokens == pytest.approx(2 + 0.98 - 5)

    def test_a_changed_limit_starts_the_bracket_over(self) -> None:
        bucket = LearnedBucket("requests", 100)
        bucket.observe(LimitReading("requests", 100, 0, 10.0), 0, 0, 0.0)  # (9.9, 10]
        assert bucket.confident and bucket.rate == pytest.approx(9.9 * bucket.HEADROOM)
        bucket.observe(LimitReading("requests", 100, 95, 1.0), 0, 0, 1.0)  # (4, 5]: slower now
        assert bucket.high == 5.0 and not bucket.confident and bucket.rate == 5.0

    def test_a_refusal_while_confident_slows_down(self) -> None:
        bucket = LearnedBucket("requests", 100)
        bucket.observe(LimitReading("requests", 100, 0, 10.0), 0, 0, 0.0)
        bucket.on_refused()
        assert bucket.rate == pytest.approx(9.9 * 0.97 * bucket.HEADROOM)


def test_a_reading_that_overtook_an_earlier_request_credits_no_capacity_it_lacks() -> None:
    # A and B leave together; B reaches the provider first, so its reading does not show A
    provider = RateLimits(rps=10, rpm=0)
    learned = LearnedLimits()
    _, a = learned.reserve({"requests": 1}, 0.0)
    _, b = learned.reserve({"requests": 1}, 0.0)
    headers_b = provider.admit(1, 1, 0.0).headers
    provider.admit(1, 1, 0.0)  # A, after B
    learned.observe(headers_b, b, sent_at=0.0, now=0.0)
    (bucket,) = learned.buckets.values()
    assert bucket.bucket is not None and bucket.bucket.tokens == provider.buckets[0].level == 8
    for done in (b, a):
        learned.answered(done)
    assert learned.unanswered == {}


def test_an_earlier_request_answered_before_a_reading_is_not_counted_again() -> None:
    provider = RateLimits(rps=10, rpm=0)
    learned = LearnedLimits()
    _, a = learned.reserve({"requests": 1}, 0.0)
    _, b = learned.reserve({"requests": 1}, 0.0)
    headers_a, headers_b = provider.admit(1, 1, 0.0).headers, provider.admit(1, 1, 0.0).headers
    learned.observe(headers_a, a, sent_at=0.0, now=0.0)  # B counted as sent after A's reading
    learned.answered(a)
    learned.observe(headers_b, b, sent_at=0.0, now=0.0)  # A answered: already in B's reading
    (bucket,) = learned.buckets.values()
    assert bucket.bucket is not None and bucket.bucket.tokens == provider.buckets[0].level == 8


def test_learned_limits_are_bounded_per_unit() -> None:
    learned = LearnedLimits()
    for limit in range(1, 20):  # a server that reports a new limit every time
        headers = {"x-ratelimit-limit-requests": str(limit * 10), "x-ratelimit-remaining-requests": "0",
                   "x-ratelimit-reset-requests": "1s"}  # fmt: skip
        _, sent = learned.reserve({"requests": 1}, float(limit))
        learned.observe(headers, sent, float(limit), float(limit))
        learned.answered(sent)
    assert len(learned.buckets) == MAX_LEARNED_BUCKETS


# ---- the engine against the rate-limited provider ------------------------------------------


@pytest.fixture
def fast_provider() -> Iterator[Running]:
    """The seed's limits scaled ×4 (40 requests/s), latency scaled down, so that the
    test runs in seconds; what is asserted is counts."""
    config = ProviderConfig(rps=40, rpm=4000, latency_median_s=0.08, latency_sigma=0.4, per_token_s=0.0)
    with Running(config) as p:
        yield p


def engine_on(url: str, **options: object) -> OpenAIEngine:
    config = OpenAIConfig(model="fake-model", base_url=url, **options)  # type: ignore[arg-type]
    return OpenAIEngine(config, rng=random.Random(1))


def test_bare_spec_runs_at_the_limit_with_almost_no_429(fast_provider: Running) -> None:
    # concurrency far above what the limit allows: without pacing a burst of 32 overruns the
    # provider's 40 at once and every round after it
    engine = engine_on(fast_provider.url, concurrency=32)
    try:
        out = engine.generate([req(i) for i in range(240)])
    finally:
        engine.close()
    assert [o.text for o in out if isinstance(o, GenOutput)] == [str(i + 1) for i in range(240)]
    stats = fast_provider.app.stats()
    seen = f"provider {stats}, engine {engine.stats}, learned {engine.learned.rates()}"
    assert stats["admitted_prompts"] == 240, seen
    assert stats["rate_limited"] <= 2, seen  # < 1 % of the requests
    assert engine.stats["overloads"] == stats["rate_limited"], seen
    rate = engine.learned.rates()["requests/40"]
    assert 0.95 * 40 <= rate < 40, seen  # learned from the headers, under the provider's
    assert engine.limit.allowed == 32, seen  # a rate limit is paced, not answered with fewer in flight


def test_tokens_per_minute_limit_is_learned_too() -> None:
    # 30,000 tokens/min = 500 per second; a request costs about 4 + 40 tokens: ~11 requests/s
    config = ProviderConfig(rps=0, rpm=0, tpm=30_000, latency_median_s=0.05, per_token_s=0.0)
    with Running(config) as provider:
        engine = engine_on(provider.url, concurrency=16)
        try:
            out = engine.generate([req(i, max_tokens=40) for i in range(60)])
        finally:
            engine.close()
        stats = provider.app.stats()
    assert sum(isinstance(o, GenOutput) for o in out) == 60
    assert stats["rate_limited"] <= 2
    assert "tokens/30000" in engine.learned.rates()


def test_first_request_goes_alone() -> None:
    in_flight_at_arrival: dict[int, int] = {}
    arrived: dict[int, float] = {}
    with FakeProvider() as provider:

        def script(n: int, body: object) -> Reply:
            in_flight_at_arrival[n] = provider.in_flight
            arrived[n] = time.monotonic()
            return Reply(delay_s=0.2 if n == 1 else 0.1)

        provider.script = script
        engine = engine_on(provider.url, concurrency=8)
        try:
            out = engine.generate([req(i) for i in range(6)])
        finally:
            engine.close()
    assert all(isinstance(o, GenOutput) for o in out)
    assert in_flight_at_arrival[1] == 1  # nothing else on its way
    # The first is answered 0.2 s after it arrived: no other left before then. (The rest go
    # together, so the one numbered 2 may find its fellows in flight: counting them raced.)
    assert arrived[2] - arrived[1] >= 0.2
    assert provider.max_in_flight > 1  # then the rest together


def test_429_without_limit_headers_still_cuts_concurrency() -> None:
    with FakeProvider() as provider:
        provider.script = lambda n, body: (
            Reply(status=429, headers={"retry-after-ms": "10"}) if n in (2, 3) else None
        )
        engine = engine_on(provider.url, concurrency=8, backoff_base_s=0.01)
        try:
            engine.generate([req(i) for i in range(8)])
        finally:
            engine.close()
    assert engine.stats["overloads"] == 2 and engine.stats["paced_refusals"] == 0
    assert engine.limit.allowed < 8
