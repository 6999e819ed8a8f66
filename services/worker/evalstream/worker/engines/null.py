"""`null`: instant empty answers, to measure the pipeline without any model cost."""

from __future__ import annotations

from evalstream.common.messages import ChatMessage
from evalstream.worker.engines.base import EngineError, GenOutput, GenRequest


def plain_prompt(messages: list[ChatMessage]) -> str:
    """A template-free rendering for engines without a tokenizer: stable, so that it can be
    part of the answer-cache key."""
    return "".join(f"<{m.role}>\n{m.content}\n" for m in messages) + "<assistant>\n"


def word_count(text: str) -> int:
    """Token estimate for engines without a tokenizer."""
    return len(text.split())


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
        return [GenOutput(text="", prompt_tokens=word_count(plain_prompt(r.messages))) for r in requests]

    def close(self) -> None:
        pass
