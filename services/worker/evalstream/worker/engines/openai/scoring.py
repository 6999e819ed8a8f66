"""Log-likelihood scoring for the `openai:` engine, through the completions endpoint.

A provider that serves prompt log-probabilities answers `POST <base>/completions` with
`{"prompt": context + continuation, "echo": true, "logprobs": 1, "max_tokens": 0}` by the
prompt's tokens (`choices[0].logprobs`: `tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`), as vLLM, SGLang and llama.cpp's server do. The continuation's tokens are those
that reach past the context's end, the context's trailing spaces counted in the continuation
(lm-eval's split; a token that straddles the boundary counts whole); their log-probabilities
are summed, and the continuation is greedy when each of them is its position's top one. A
`loglikelihood_rolling` request scores the whole document as one prompt: every token but the
first, which has no log-probability without a prefix token (lm-eval conditions it on EOT/BOS
and windows long documents with its tokenizer, which this engine does not have; a document
longer than the model's context is refused by the provider).

Requests go through the engine's own pacing, retries and key (engine.py). A provider
that does not return prompt log-probabilities (OpenAI's own chat models, DeepSeek, any
chat-only gateway) fails the items at once with a PermanentEngineError that names it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evalstream.worker.engines.base import (
    EngineError,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
)

if TYPE_CHECKING:
    from evalstream.worker.engines.openai.engine import OpenAIEngine

SCORING_PATH = "completions"


def scoring_body(model: str, prompt: str) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
        "temperature": 0.0,
    }


def unsupported(provider: str, why: str) -> PermanentEngineError:
    return PermanentEngineError(
        f"{provider} does not return prompt log-probabilities, which log-likelihood scoring needs "
        f"(POST {SCORING_PATH} with echo=true, logprobs=1, max_tokens=0, as vLLM, SGLang and "
        f"llama.cpp's server answer): {why}"
    )


@dataclass(frozen=True)
class PromptLogprobs:
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


def prompt_logprobs_parser(provider: str) -> Callable[[bytes], PromptLogprobs | PermanentEngineError]:
    """Reads a completions answer's prompt log-probabilities. A body that is not JSON or not
    a completion raises ValueError (retried, as any malformed answer); a completion without
    them is the provider's way of not serving them: a PermanentEngineError."""

    def parse(body: bytes) -> PromptLogprobs | PermanentEngineError:
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed JSON: {exc}") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("no choices in the response")
        logprobs = choices[0].get("logprobs")
        if not isinstance(logprobs, dict):
            return unsupported(provider, "the answer has no logprobs")
        tokens, values, tops, offsets = (
            logprobs.get(k) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        )
        if not (isinstance(tokens, list) and isinstance(values, list) and isinstance(offsets, list)):
            return unsupported(
                provider, "the answer's logprobs have no tokens, token_logprobs and text_offset"
            )
        if tops is None:
            tops = [None] * len(tokens)
        if not (isinstance(tops, list) and len(tokens) == len(values) == len(offsets) == len(tops)):
            raise ValueError("logprobs lists of different lengths")
        try:
            return PromptLogprobs(
                tokens=[str(t) for t in tokens],
                token_logprobs=[None if v is None else float(v) for v in values],
                top_logprobs=[
                    {str(k): float(v) for k, v in t.items()} if isinstance(t, dict) else None for t in tops
                ],
                text_offset=[int(o) for o in offsets],
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"unreadable logprobs: {exc}") from None

    return parse


def span_score(lp: PromptLogprobs, start: int, end: int, first: int = 0) -> tuple[float, bool, int]:
    """(sum of log-probabilities, all greedy, tokens) of the prompt's tokens from token
    `first` on that reach past character `start` and begin before character `end` (the
    prompt's length: tokens after it were generated). Raises ValueError for a token without
    a log-probability."""
    total, greedy, n = 0.0, True, 0
    for i, offset in enumerate(lp.text_offset):
        if i < first:
            continue
        if offset >= end:
            break
        token_end = lp.text_offset[i + 1] if i + 1 < len(lp.text_offset) else end
        if max(token_end, offset + len(lp.tokens[i])) <= start:
            continue
        value = lp.token_logprobs[i]
        if value is None:
            raise ValueError(
                "the provider gives no log-probability for the prompt's first token "
                "(an empty context cannot be scored this way)"
                if i == 0
                else f"no log-probability for prompt token {i}"
            )
        top = lp.top_logprobs[i]
        greedy = greedy and top is not None and bool(top) and value >= max(top.values())
        total += value
        n += 1
    if n == 0:
        raise ValueError("no prompt token covers the continuation")
    return total, greedy, n


async def _score(
    engine: OpenAIEngine,
    prompt: str,
    start: int,
    parse: Callable[[bytes], PromptLogprobs | PermanentEngineError],
    first: int = 0,
) -> LLOutput | EngineError:
    started = time.monotonic()
    outcome = await engine._request(scoring_body(engine.config.model, prompt), SCORING_PATH, parse)
    if isinstance(outcome, PermanentEngineError) and "prompt log-probabilities" not in str(outcome):
        return unsupported(engine.revision, str(outcome))  # e.g. a 400 for echo, a 404 for the route
    if isinstance(outcome, EngineError):
        return outcome
    lp, _attempts = outcome
    try:
        total, greedy, n = span_score(lp, start, len(prompt), first)
    except ValueError as exc:
        return PermanentEngineError(f"{engine.revision}: {exc}")
    prompt_tokens = sum(1 for o in lp.text_offset if o < len(prompt))
    return LLOutput(total, greedy, prompt_tokens, n, latency_ms=(time.monotonic() - started) * 1000)


async def loglikelihood_all(engine: OpenAIEngine, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
    parse = prompt_logprobs_parser(engine.revision)
    return list(
        await asyncio.gather(
            *(_score(engine, r.context + r.continuation, len(r.context.rstrip()), parse) for r in requests)
        )
    )


async def rolling_all(engine: OpenAIEngine, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
    parse = prompt_logprobs_parser(engine.revision)

    async def one(r: RollingRequest) -> LLOutput | EngineError:
        if not r.text:
            return PermanentEngineError("an empty document")
        # every token but the first, which no context precedes
        return await _score(engine, r.text, 0, parse, first=1)

    return list(await asyncio.gather(*(one(r) for r in requests)))
