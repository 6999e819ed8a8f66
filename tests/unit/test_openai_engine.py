"""The `openai:` engine: its pacing math, and its behaviour against a local fake provider
(429 storms, 5xx, slow and hung responses, malformed bodies, code fences, secrets)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.common.settings import Settings
from evalstream.worker.engines import EngineConfigError, load_engine, validate_spec
from evalstream.worker.engines.base import GenOutput, GenRequest, PermanentEngineError, TransientEngineError
from evalstream.worker.engines.openai import (
    AdaptiveLimit,
    OpenAIConfig,
    OpenAIConfigError,
    OpenAIEngine,
    TokenBucket,
    backoff_delay,
    parse_completion,
    parse_target,
    rate_buckets,
    retry_after_seconds,
)
from evalstream.worker.grading.clean import extract_code
from tests.fakes.openai_provider import FakeProvider, Reply, storm

SECRET = "sk-test-0123456789abcdef-SECRET"


def req(i: int, question: str | None = None, **params: object) -> GenRequest:
    q = question or f"What is {i} + 1?"
    return GenRequest(f"q{i}", [ChatMessage("user", q)], GenerationParams(**params))  # type: ignore[arg-type]


# ---- configuration ----------------------------------------------------------------------


def test_parse_target_options_from_query_then_env_then_defaults() -> None:
    env = {"OPENAI_RPS": "3", "OPENAI_CONCURRENCY": "2", "OPENAI_TIMEOUT_S": "7.5"}
    c = parse_target("deepseek-chat@https://API.deepseek.com/v1/?concurrency=16", env)
    assert (c.model, c.base_url) == ("deepseek-chat", "https://api.deepseek.com/v1")
    assert (c.concurrency, c.rps, c.rpm, c.timeout_s, c.max_retries) == (16, 3.0, 0.0, 7.5, 6)
    assert parse_target("Qwen/Qwen2.5-7B@http://127.0.0.1:8000/v1", {}).model == "Qwen/Qwen2.5-7B"


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("m@http://h/v1?rps=fast", "rps='fast' is not a float"),
        ("m@http://h/v1?burst=3", "unknown option(s) burst"),
        ("m@http://h/v1?concurrency=0", "concurrency must be in 1..64"),
        ("m@http://h/v1?concurrency=65", "concurrency must be in 1..64"),
        ("m@http://h/v1?timeout=86400", "timeout must be in 0.001..120"),
        ("m@http://h/v1?retries=1000", "retries must be in 0..8"),
        # a job never names the variable a worker reads its key from
        ("m@http://h/v1?key_env=DATABASE_URL", "unknown option(s) key_env"),
        ("m@ftp://h/v1", "neither an http(s) base url nor a provider preset"),
        # two readers splitting on different '@'s must not be possible: one '@', no user info
        ("m@https://good/v1@https://evil/v1", "exactly one '@'"),
        ("m@https://user:pw@good/v1", "exactly one '@'"),
        ("m@https://good/v1#frag", "fragment"),
    ],
)
def test_parse_target_rejects(target: str, fragment: str) -> None:
    with pytest.raises(OpenAIConfigError) as info:
        parse_target(target, {})
    assert fragment in str(info.value)
    assert fragment in (validate_spec(f"openai:{target}") or "")


# ---- pacing math --------------------------------------------------------------------------


class TestAdaptiveLimit:
    def test_halves_once_per_epoch(self) -> None:
        limit = AdaptiveLimit(maximum=16)
        epoch = limit.epoch
        assert limit.on_overload(epoch) and limit.allowed == 8
        # the other 429s of the same round of requests do not cut again
        assert not limit.on_overload(epoch) and limit.allowed == 8
        assert limit.on_overload(limit.epoch) and limit.allowed == 4
        for _ in range(10):
            limit.on_overload(limit.epoch)
        assert limit.allowed == 1 and limit.value == 1.0

    def test_grows_by_one_per_round_of_successes(self) -> None:
        limit = AdaptiveLimit(maximum=10)
        limit.on_overload(0)
        assert limit.allowed == 5
        for _ in range(5):  # one round at limit 5
            limit.on_success()
        assert limit.allowed == 5 and limit.value == pytest.approx(6.0, abs=0.2)
        for _ in range(200):
            limit.on_success()
        assert limit.allowed == 10  # never above the ceiling

    def test_bounds(self) -> None:
        with pytest.raises(ValueError):
            AdaptiveLimit(maximum=2, minimum=3)


class TestTokenBucket:
    def test_burst_then_steady_rate(self) -> None:
        bucket = TokenBucket(rate=5.0, capacity=5.0, now=0.0)
        assert [bucket.reserve(0.0) for _ in range(5)] == [0.0] * 5
        # reservations queue up: the 6th waits 0.2 s, the 7th 0.4 s
        assert [round(bucket.reserve(0.0), 6) for _ in range(2)] == [0.2, 0.4]

    def test_refills_up_to_capacity(self) -> None:
        bucket = TokenBucket(rate=2.0, capacity=2.0, now=0.0)
        bucket.reserve(0.0), bucket.reserve(0.0)
        assert bucket.reserve(0.5) == pytest.approx(0.0)  # half a second: one token back
        assert bucket.reserve(100.0) == 0.0 and bucket.tokens == pytest.approx(1.0)  # capped at 2

    def test_rates_per_second_and_minute(self) -> None:
        buckets = rate_buckets(rps=5, rpm=120, now=0.0)
        assert [(b.rate, b.capacity) for b in buckets] == [(5.0, 5.0), (2.0, 2.0)]
        assert rate_buckets(0, 30, 0.0)[0].capacity == 1.0  # at least one request
        assert rate_buckets(0, 0, 0.0) == []


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(7)
    for retry, ceiling in [(0, 0.5), (1, 1.0), (3, 4.0), (10, 30.0)]:
        delays = [backoff_delay(retry, 0.5, 30.0, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 4  # jittered, not synchronised


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"Retry-After": "3"}) == 3.0
    assert retry_after_seconds({"retry-after-ms": "250", "Retry-After": "9"}) == 0.25
    now = time.time()
    assert retry_after_seconds({"Retry-After": formatdate(now + 30, usegmt=True)}, now) == pytest.approx(
        30, abs=1
    )
    assert retry_after_seconds({"Retry-After": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_parse_completion() -> None:
    body = b'{"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}'
    assert parse_completion(body).__dict__ == {
        "text": "42", "prompt_tokens": 9, "completion_tokens": 1, "finish_reason": "stop"
    }  # fmt: skip
    assert parse_completion(b'{"choices": [{"message": {"content": null}}]}').text == ""
    for bad in (b"<html>502 Bad Gateway</html>", b'{"choices": []}', b'{"error": {"message": "x"}}', b"{"):
        with pytest.raises(ValueError):
            parse_completion(bad)


# ---- against the fake provider ------------------------------------------------------------


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def engine_for(provider: FakeProvider, **overrides: object) -> OpenAIEngine:
    options: dict[str, object] = {"backoff_base_s": 0.02, "backoff_cap_s": 0.2, "timeout_s": 5.0, **overrides}
    config = OpenAIConfig(model="fake-model", base_url=provider.url, **options)  # type: ignore[arg-type]
    rules = f"{provider.url}/*=FAKE_API_KEY"
    return OpenAIEngine(config, key_rules=rules, env={"FAKE_API_KEY": SECRET}, rng=random.Random(1))


ALLOW_OPENAI = Settings(worker_model="openai:*")


def test_answers_usage_and_what_is_sent(provider: FakeProvider) -> None:
    engine = load_engine(provider.spec(), ALLOW_OPENAI)
    try:
        assert engine.revision == f"fake-model@{provider.url}" and engine.cacheable
        out = engine.generate([req(1, max_tokens=17, stop=["\n\n"]), req(2, temperature=0.5, seed=3)])
    finally:
        engine.close()
    assert [o.text for o in out if isinstance(o, GenOutput)] == ["2", "3"]
    first = out[0]
    assert isinstance(first, GenOutput) and (first.prompt_tokens, first.completion_tokens) == (5, 1)
    sent = sorted((r.body or {} for r in provider.requests), key=lambda b: b["messages"][0]["content"])
    assert sent[0] == {
        "model": "fake-model", "messages": [{"role": "user", "content": "What is 1 + 1?"}],
        "max_tokens": 17, "temperature": 0.0, "top_p": 1.0, "stop": ["\n\n"],
    }  # fmt: skip
    assert sent[1]["seed"] == 3 and "seed" not in sent[0]
    assert all("authorization" not in {k.lower() for k in r.headers} for r in provider.requests)


def test_429_storm_is_ridden_out_honouring_retry_after(provider: FakeProvider) -> None:
    provider.script = storm(first=12, retry_after=0.5)
    engine = engine_for(provider, concurrency=8)
    started = time.monotonic()
    out = engine.generate([req(i) for i in range(20)])
    elapsed = time.monotonic() - started
    engine.close()
    assert [o.text for o in out if isinstance(o, GenOutput)] == [str(i + 1) for i in range(20)]
    assert provider.count(429) == 12 and provider.count(200) == 20
    assert engine.stats["retries"] == 12
    assert elapsed >= 0.5  # every refused request waited its Retry-After
    assert engine.limit.allowed < 8  # cut by the storm, growing back slowly
    # the pause applied to everyone: no request reached the provider within Retry-After of the first 429
    first_429 = min(r.at for r in provider.requests if r.status == 429)
    successes = [r.at for r in provider.requests if r.status == 200]
    assert min(successes) - first_429 >= 0.45


def test_concurrency_never_exceeds_the_limit(provider: FakeProvider) -> None:
    provider.script = lambda n, body: Reply(delay_s=0.15)
    engine = engine_for(provider, concurrency=3)
    out = engine.generate([req(i) for i in range(9)])
    engine.close()
    assert all(isinstance(o, GenOutput) for o in out)
    assert provider.max_in_flight == 3


def test_rate_limit_paces_requests(provider: FakeProvider) -> None:
    engine = engine_for(provider, rps=10.0, concurrency=20)
    engine.generate([req(i) for i in range(20)])
    engine.close()
    times = sorted(r.at for r in provider.requests)
    # a burst of 10, then one every 0.1 s: the 20th cannot leave before about 1 s after the
    # first. Only this lower bound is checked: load can slow requests, never speed them up.
    assert len(times) == 20 and times[-1] - times[0] >= 0.85


def test_server_errors_are_retried_with_backoff(provider: FakeProvider) -> None:
    provider.script = lambda n, body: Reply(status=503 if n % 2 else 500) if n <= 4 else None
    engine = engine_for(provider)
    out = engine.generate([req(1)])
    engine.close()
    assert isinstance(out[0], GenOutput) and out[0].extra["http_attempts"] == "5"
    assert provider.statuses() == [503, 500, 503, 500, 200]


def test_persistent_failure_becomes_transient_after_the_retries(provider: FakeProvider) -> None:
    provider.script = lambda n, body: Reply(status=502, raw_body=b"<html>Bad Gateway</html>")
    engine = engine_for(provider, max_retries=3)
    (out,) = engine.generate([req(1)])
    engine.close()
    assert isinstance(out, TransientEngineError)
    assert "server_error after 4 attempt(s)" in str(out) and "Bad Gateway" in str(out)
    assert provider.count() == 4


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_client_errors_fail_at_once(provider: FakeProvider, status: int) -> None:
    provider.script = lambda n, body: Reply(status=status)
    engine = engine_for(provider)
    (out,) = engine.generate([req(1)])
    engine.close()
    assert isinstance(out, PermanentEngineError) and f"HTTP {status}" in str(out)
    assert provider.count() == 1


def test_slow_answer_waits_and_hung_answer_times_out(provider: FakeProvider) -> None:
    provider.script = lambda n, body: Reply(delay_s=0.4) if "slow" in str(body) else Reply(hang=True)
    engine = engine_for(provider, timeout_s=1.0, max_retries=1)
    started = time.monotonic()
    slow, hung = engine.generate([req(1, "slow: What is 1 + 1?"), req(2, "hang")])
    elapsed = time.monotonic() - started
    engine.close()
    assert isinstance(slow, GenOutput) and slow.text == "2" and slow.latency_ms >= 400
    assert isinstance(hung, TransientEngineError) and "timeout after 2 attempt(s)" in str(hung)
    assert 2.0 <= elapsed < 4.0  # two attempts of 1 s, plus a short backoff


def test_malformed_body_is_retried(provider: FakeProvider) -> None:
    provider.script = lambda n, body: Reply(raw_body=b'{"choices": [{"mess') if n == 1 else None
    engine = engine_for(provider)
    (out,) = engine.generate([req(1)])
    engine.close()
    assert isinstance(out, GenOutput) and out.text == "2" and provider.count() == 2


def test_connection_refused_is_transient() -> None:
    with FakeProvider() as gone:
        url = gone.url
    engine = OpenAIEngine(OpenAIConfig(model="m", base_url=url, max_retries=1, backoff_base_s=0.01), env={})
    (out,) = engine.generate([req(1)])
    engine.close()
    assert isinstance(out, TransientEngineError) and "connection_error after 2 attempt(s)" in str(out)


def test_code_fenced_answer_comes_back_verbatim(provider: FakeProvider) -> None:
    code = "def add(a, b):\n    return a + b\n"
    provider.script = lambda n, body: Reply(
        content=f"Here you go:\n```python\n{code}```\nEnjoy!", usage=False
    )
    engine = engine_for(provider)
    (out,) = engine.generate([req(1)])
    engine.close()
    assert isinstance(out, GenOutput) and out.text.startswith("Here you go:\n```python")
    assert extract_code(out.text, "add") == code.rstrip()
    assert out.completion_tokens == 0  # no usage sent: nothing invented


def test_calls_from_several_threads_share_one_limit(provider: FakeProvider) -> None:
    provider.script = lambda n, body: Reply(delay_s=0.05)
    engine = engine_for(provider, concurrency=4)
    results: list[list[object]] = []

    def call(k: int) -> None:
        results.append(list(engine.generate([req(10 * k + i) for i in range(5)])))

    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    assert sum(isinstance(o, GenOutput) for r in results for o in r) == 20
    assert provider.max_in_flight <= 4


def test_the_key_is_sent_but_never_shown(provider: FakeProvider, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    engine = engine_for(provider)
    (ok,) = engine.generate([req(1)])
    # a careless server that echoes the key in its errors
    provider.script = lambda n, body: Reply(status=401, raw_body=f"invalid key {SECRET}".encode())
    (refused,) = engine.generate([req(2)])
    provider.script = lambda n, body: Reply(status=500, raw_body=f"trace: Bearer {SECRET}".encode())
    (failed,) = engine.generate([req(3)])
    shown = [repr(engine), repr(engine.config), str(refused), repr(refused), str(failed), caplog.text]
    engine.close()
    assert isinstance(ok, GenOutput)
    assert provider.requests[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert isinstance(refused, PermanentEngineError) and "***" in str(refused)
    assert isinstance(failed, TransientEngineError) and "***" in str(failed)
    assert not [s for s in shown if SECRET in s]
    assert caplog.records  # httpx did log the requests, without the key


def test_load_engine_rejects_bad_options() -> None:
    with pytest.raises(EngineConfigError, match="unknown option"):
        load_engine("openai:m@http://127.0.0.1:1/v1?speed=3", ALLOW_OPENAI)
