"""The engine Protocol: everything the worker's lifecycle knows about a model.

Pipeline code depends on this Protocol only, so pipeline tests run with the `null` or
`replay` engines and never need a GPU (the inspect_ai way).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from evalstream.common.messages import ChatMessage, GenerationParams


def plain_prompt(messages: list[ChatMessage]) -> str:
    """A template-free rendering for engines without a tokenizer: stable, so that it can be
    part of the answer-cache key."""
    return "".join(f"<{m.role}>\n{m.content}\n" for m in messages) + "<assistant>\n"


def word_count(text: str) -> int:
    """Token estimate for engines without a tokenizer."""
    return len(text.split())


class EngineError(Exception):
    """A failure of one request. `transient` ones are retried through eval.retry."""

    transient: bool = False


class TransientEngineError(EngineError):
    transient = True


class PermanentEngineError(EngineError):
    transient = False


R = TypeVar("R")
Out = TypeVar("Out")


def guarded_call(
    name: str, call: Callable[[list[R]], list[Out]], requests: Sequence[R], what: str
) -> list[Out | EngineError]:
    """call(requests) for an engine's batch: an engine that raises, or returns the wrong
    number of outputs, fails each of its requests transiently (so that they go through
    eval.retry and the DLQ instead of looping the whole batch)."""
    try:
        outputs: list[Out | EngineError] = list(call(list(requests)))
    except Exception as exc:
        logging.getLogger("evalstream.worker").exception(
            "engine %s raised on a %s batch of %d", name, what, len(requests)
        )
        return [TransientEngineError(f"{type(exc).__name__}: {exc}") for _ in requests]
    if len(outputs) != len(requests):
        error = f"engine {name} returned {len(outputs)} {what} outputs for {len(requests)} requests"
        return [TransientEngineError(error) for _ in requests]
    return outputs


@dataclass(frozen=True)
class GenRequest:
    item_id: str
    messages: list[ChatMessage]  # system + user turns; engines render with their chat template
    params: GenerationParams
    attempt: int = 1
    # A raw prompt (Shard.raw_prompt): the model reads this text exactly, instead of the
    # rendered `messages` (no chat template; an API engine uses its completions endpoint).
    # `messages` then holds it as one user turn, for engines that only record prompts.
    prompt: str | None = None


@dataclass(frozen=True)
class GenOutput:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: bool = False  # the prompt was cut to fit the context window
    latency_ms: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LLRequest:
    """lm-eval's `loglikelihood` request: how likely `continuation` is after `context`, both
    raw text (no template). `index` is the choice's place in its item (replayed scores are
    found by item and index)."""

    item_id: str
    context: str
    continuation: str
    index: int = 0
    attempt: int = 1


@dataclass(frozen=True)
class RollingRequest:
    """lm-eval's `loglikelihood_rolling` request: the log-likelihood of a whole document, in
    windows of the model's context length."""

    item_id: str
    text: str
    attempt: int = 1


@dataclass(frozen=True)
class LLOutput:
    loglikelihood: float  # sum of the scored tokens' log-probabilities (natural log)
    is_greedy: bool  # every scored token is the model's most likely one (False for rolling)
    prompt_tokens: int = 0  # tokens the model read (context and continuation)
    scored_tokens: int = 0  # tokens whose log-probabilities are summed
    truncated: bool = False  # the context was cut from the left to fit the context window
    latency_ms: float = 0.0


@runtime_checkable
class Engine(Protocol):
    """A loaded model. `generate` is blocking (it runs in a worker thread, off the event
    loop) and returns one output or one EngineError per request, in order; so do
    `loglikelihood` and `loglikelihood_rolling`, which score instead of generating (the same
    request gives the same number whatever else is in its call)."""

    name: str  # the model SPEC it serves
    revision: str  # weights hash or API model version: part of the answer-cache key
    cacheable: bool  # whether answers go through the answer cache
    device: str

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        """The exact text the model sees (the cache key hashes it)."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]: ...

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]: ...

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]: ...

    def close(self) -> None: ...
