"""`null`: instant empty answers (and log-likelihoods of 0), to measure the pipeline without
any model cost."""

from __future__ import annotations

from evalstream.common.messages import ChatMessage
from evalstream.worker.engines.base import (
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    RollingRequest,
    plain_prompt,
    word_count,
)


class NullEngine:
    name = "null"
    revision = "null-1"
    # It measures the pipeline itself: a cache in front of it would measure the cache.
    cacheable = False
    device = "none"

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        return plain_prompt(messages)

    def count_tokens(self, text: str) -> int:
        return word_count(text)

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        return [
            GenOutput(
                text="",
                prompt_tokens=word_count(r.prompt if r.prompt is not None else plain_prompt(r.messages)),
            )
            for r in requests
        ]

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        """Deterministic zeros (every choice equally likely: the first one wins)."""
        return [
            LLOutput(
                0.0,
                False,
                prompt_tokens=word_count(r.context + r.continuation),
                scored_tokens=word_count(r.continuation),
            )
            for r in requests
        ]

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        return [
            LLOutput(0.0, False, prompt_tokens=word_count(r.text), scored_tokens=word_count(r.text))
            for r in requests
        ]

    def close(self) -> None:
        pass
