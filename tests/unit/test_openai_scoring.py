"""The `openai:` engine's log-likelihood scoring (issue 24) against a local OpenAI-compatible
fake (tests/fakes/openai_provider.py): the completions request with echo and logprobs, the
continuation's tokens split at the context's end as lm-eval splits them, greediness from the
top log-probabilities, rolling documents, and a clear permanent error from a provider that
returns no prompt log-probabilities or refuses the request."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from evalstream.worker.engines.base import LLOutput, LLRequest, PermanentEngineError, RollingRequest
from evalstream.worker.engines.openai import OpenAIConfig, OpenAIEngine
from evalstream.worker.engines.openai.scoring import PromptLogprobs, span_score
from tests.fakes.openai_provider import FakeProvider, Reply, fake_is_top, fake_logprob, fake_tokens


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


@pytest.fixture
def engine(provider: FakeProvider) -> Iterator[OpenAIEngine]:
    config = OpenAIConfig(model="fake-model", base_url=provider.url, backoff_base_s=0.01, backoff_cap_s=0.05)
    loaded = OpenAIEngine(config, rng=random.Random(1))
    yield loaded
    loaded.close()


def expected(context: str, continuation: str) -> tuple[float, bool, int]:
    """What the fake's tokens of the continuation sum to: those ending past the context with
    its trailing spaces taken off (the fake's tokens carry their leading spaces)."""
    boundary = len(context.rstrip())
    tokens = fake_tokens(context + continuation)
    mine = [t for i, (t, o) in enumerate(tokens) if o + len(t) > boundary and i > 0]
    return sum(fake_logprob(t) for t in mine), all(fake_is_top(t) for t in mine), len(mine)


def test_scores_the_continuation_from_the_prompts_logprobs(
    provider: FakeProvider, engine: OpenAIEngine
) -> None:
    requests = [
        LLRequest("a", "The capital of France is", " Paris"),
        LLRequest("a", "The capital of France is", " the city of Lyon", index=1),
        LLRequest(
            "b", "Question: 2+2=? Answer: ", "4"
        ),  # trailing space: the token " 4" is the continuation's
        LLRequest("c", "Zebras", " eat grass slowly"),
    ]
    outs = engine.loglikelihood(requests)
    for request, out in zip(requests, outs, strict=True):
        assert isinstance(out, LLOutput), out
        ll, greedy, n = expected(request.context, request.continuation)
        assert (out.loglikelihood, out.is_greedy, out.scored_tokens) == (pytest.approx(ll), greedy, n)
    assert outs[2].scored_tokens == 1 if isinstance(outs[2], LLOutput) else False
    assert {o.is_greedy for o in outs if isinstance(o, LLOutput)} == {True, False}  # both kinds seen
    bodies = [r.body or {} for r in provider.requests]
    assert all(
        (b["echo"], b["logprobs"], b["max_tokens"], b["temperature"]) == (True, 1, 0, 0.0) for b in bodies
    )
    assert sorted(b["prompt"] for b in bodies) == sorted(r.context + r.continuation for r in requests)


def test_rolling_scores_every_token_but_the_first(engine: OpenAIEngine) -> None:
    text = "It was the best of times, it was the worst of times."
    (out,) = engine.loglikelihood_rolling([RollingRequest("d", text)])
    tokens = fake_tokens(text)
    assert isinstance(out, LLOutput)
    assert out.loglikelihood == pytest.approx(sum(fake_logprob(t) for t, _ in tokens[1:]))
    assert out.scored_tokens == len(tokens) - 1


def test_a_provider_without_prompt_logprobs_fails_items_at_once_naming_it(
    provider: FakeProvider, engine: OpenAIEngine
) -> None:
    provider.prompt_logprobs = False
    (out,) = engine.loglikelihood([LLRequest("a", "The capital of France is", " Paris")])
    assert isinstance(out, PermanentEngineError)
    assert f"fake-model@{provider.url}" in str(out) and "prompt log-probabilities" in str(out)
    assert provider.count() == 1  # not retried


def test_a_provider_that_refuses_echo_fails_items_at_once_naming_it(
    provider: FakeProvider, engine: OpenAIEngine
) -> None:
    provider.script = lambda n, body: Reply(
        status=400, raw_body=b'{"error": {"message": "echo is not supported with logprobs"}}'
    )
    (out,) = engine.loglikelihood([LLRequest("a", "x", " y")])
    assert isinstance(out, PermanentEngineError)
    assert "prompt log-probabilities" in str(out) and "echo is not supported" in str(out)
    assert provider.count() == 1


def test_an_empty_context_cannot_be_scored_this_way(engine: OpenAIEngine) -> None:
    (out,) = engine.loglikelihood([LLRequest("a", "", "Hello world")])
    assert isinstance(out, PermanentEngineError) and "first token" in str(out)


def test_overload_is_retried_as_for_generation(provider: FakeProvider, engine: OpenAIEngine) -> None:
    provider.script = lambda n, body: Reply(status=503) if n == 1 else None
    (out,) = engine.loglikelihood([LLRequest("a", "The capital of France is", " Paris")])
    assert isinstance(out, LLOutput) and provider.statuses() == [503, 200]


def test_span_score_counts_a_straddling_token_and_ignores_generated_ones() -> None:
    lp = PromptLogprobs(
        tokens=["ab", "cd", "ef", "!"],
        token_logprobs=[None, -1.0, -2.0, -9.0],
        top_logprobs=[None, {"cd": -1.0}, {"x": -0.5}, {"!": -9.0}],
        text_offset=[0, 2, 4, 6],
    )
    # the continuation starts at character 3, inside "cd"; the prompt ends at 6: "!" was generated
    assert span_score(lp, 3, 6) == (-3.0, False, 2)
    assert span_score(lp, 4, 6) == (-2.0, False, 1)
    assert span_score(lp, 0, 6, first=1) == (-3.0, False, 2)
    with pytest.raises(ValueError, match="first token"):
        span_score(lp, 0, 6)
