"""An artificial per-item delay around any engine (ENGINE_DELAY_MS), for benchmarks that
need a slower worker group: a batch of n requests takes n × delay longer, as on a device
with a fixed item throughput. Answers (and so the cache key) are the wrapped engine's."""

from __future__ import annotations

import time

from evalstream.common.messages import ChatMessage
from evalstream.worker.engines.base import Engine, EngineError, GenOutput, GenRequest


class SlowEngine:
    def __init__(self, inner: Engine, delay_ms: float) -> None:
        if delay_ms < 0:
            raise ValueError(f"ENGINE_DELAY_MS must be >= 0, got {delay_ms}")
        self.inner = inner
        self.delay_s = delay_ms / 1000
        self.name = inner.name
        self.revision = inner.revision
        self.cacheable = inner.cacheable
        self.device = inner.device

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        return self.inner.render_prompt(messages)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        time.sleep(self.delay_s * len(requests))  # runs in the worker's engine thread
        return self.inner.generate(requests)

    def close(self) -> None:
        self.inner.close()
