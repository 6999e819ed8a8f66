"""The engine Protocol: everything the worker's lifecycle knows about a model.

Pipeline code depends on this Protocol only, so pipeline tests run with the `null` or
`replay` engines and never need a GPU (the inspect_ai way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evalstream.common.messages import ChatMessage, GenerationParams


class EngineError(Exception):
    """A failure of one request. `transient` ones are retried through eval.retry."""

    transient: bool = False


class TransientEngineError(EngineError):
    transient = True


class PermanentEngineError(EngineError):
    transient = False


@dataclass(frozen=True)
class GenRequest:
    item_id: str
    messages: list[ChatMessage]  # system + user turns; engines render with their chat template
    params: GenerationParams
    attempt: int = 1


@dataclass(frozen=True)
class GenOutput:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: bool = False  # the prompt was cut to fit the context window
    latency_ms: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """A loaded model. `generate` is blocking (it runs in a worker thread, off the event
    loop) and returns one output or one EngineError per request, in order."""

    name: str  # the model SPEC it serves
    revision: str  # weights hash or API model version: part of the answer-cache key
    cacheable: bool  # whether answers go through the answer cache
    device: str

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        """The exact text the model sees (the cache key hashes it)."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]: ...

    def close(self) -> None: ...
