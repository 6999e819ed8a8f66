"""TEST-ONLY engine hooks, applied at one point (`wrap_for_tests`), never set in production:

* ENGINE_FAULTS: a ChaosEngine makes chosen requests fail, deterministically (the fault
  suite, the pipeline tests);
* ENGINE_DELAY_MS: a SlowEngine adds a per-item delay (benchmarks that need a slower group).

ENGINE_FAULTS is a string such as "transient=0.1,permanent=0.01,seed=7", parsed once. An item fails permanently when u(seed, item) < permanent, whatever the
attempt; an attempt fails transiently when u(seed, item, attempt) < transient. `u` is a
sha256-derived uniform number in [0, 1), the same in every process (unlike hash()), so that
tests can compute which items must end in the DLQ and which must succeed after retries.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from evalstream.common.messages import ChatMessage
from evalstream.common.settings import TestHookSettings
from evalstream.worker.engines import EngineConfigError
from evalstream.worker.engines.base import (
    Engine,
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    TransientEngineError,
)

FailureKind = Literal["transient", "permanent"]


class _Addressed(Protocol):
    @property
    def item_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...


R = TypeVar("R", bound=_Addressed)
Out = TypeVar("Out")


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class FaultPlan:
    transient: float = 0.0
    permanent: float = 0.0
    seed: int = 0

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """ "transient=0.1,permanent=0.01,seed=7" (any subset, any order; "" = no faults)."""
        values: dict[str, float | int] = {}
        for part in text.replace(";", ",").split(","):
            if not part.strip():
                continue
            key, eq, raw = (s.strip() for s in part.partition("="))
            try:
                if not eq or key not in ("transient", "permanent", "seed"):
                    raise ValueError("expected transient=RATE, permanent=RATE or seed=INT")
                values[key] = int(raw) if key == "seed" else float(raw)
                if key != "seed" and not 0.0 <= values[key] <= 1.0:
                    raise ValueError("a rate must be in 0..1")
            except ValueError as exc:
                raise EngineConfigError(f"engine faults {text!r}: {part.strip()!r}: {exc}") from exc
        return cls(**values)  # type: ignore[arg-type]

    def planned_failure(self, item_id: str, attempt: int) -> FailureKind | None:
        # separate tags keep the two draws independent of each other
        if self.permanent and _uniform("permanent", self.seed, item_id) < self.permanent:
            return "permanent"
        if self.transient and _uniform("transient", self.seed, item_id, attempt) < self.transient:
            return "transient"
        return None


class _Wrapper:
    """An engine around another: answers (and so the cache key) are the wrapped engine's,
    name and revision are passed through; only `generate` (and scoring) differ."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision
        self.cacheable = inner.cacheable
        self.device = inner.device

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        return self.inner.render_prompt(messages)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        return self.inner.loglikelihood(requests)

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        return self.inner.loglikelihood_rolling(requests)

    def close(self) -> None:
        self.inner.close()


class ChaosEngine(_Wrapper):
    """Makes the planned requests fail; the ones it lets through reach the wrapped engine in
    one call, so batching behaviour is unchanged."""

    def __init__(self, inner: Engine, faults: str | FaultPlan) -> None:
        super().__init__(inner)
        self.plan = faults if isinstance(faults, FaultPlan) else FaultPlan.parse(faults)

    def planned_failure(self, item_id: str, attempt: int) -> FailureKind | None:
        return self.plan.planned_failure(item_id, attempt)

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        return self._faulty(requests, self.inner.generate)

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        return self._faulty(requests, self.inner.loglikelihood)

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        return self._faulty(requests, self.inner.loglikelihood_rolling)

    def _faulty(self, requests: list[R], call: Callable[[list[R]], list[Out]]) -> list[Out | EngineError]:
        out: list[Out | EngineError | None] = []
        passed: list[R] = []
        for r in requests:
            kind = self.planned_failure(r.item_id, r.attempt)
            if kind == "permanent":
                out.append(PermanentEngineError(f"injected permanent fault (item {r.item_id})"))
            elif kind == "transient":
                out.append(
                    TransientEngineError(f"injected transient fault (item {r.item_id}, attempt {r.attempt})")
                )
            else:
                out.append(None)
                passed.append(r)
        results = iter(call(passed) if passed else [])
        return [o if o is not None else next(results) for o in out]


class SlowEngine(_Wrapper):
    """An artificial per-item delay: a batch of n requests takes n × delay longer, as on a
    device with a fixed item throughput."""

    def __init__(self, inner: Engine, delay_ms: float) -> None:
        if delay_ms < 0:
            raise ValueError(f"ENGINE_DELAY_MS must be >= 0, got {delay_ms}")
        super().__init__(inner)
        self.delay_s = delay_ms / 1000

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        time.sleep(self.delay_s * len(requests))  # runs in the worker's engine thread
        return self.inner.generate(requests)

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        time.sleep(self.delay_s * len(requests))
        return self.inner.loglikelihood(requests)


@dataclass(frozen=True)
class EngineTestHooks:
    """The engine hooks of the test-only settings, parsed once (at the worker's start)."""

    faults: FaultPlan | None = None
    delay_ms: float = 0.0

    @classmethod
    def from_settings(cls, settings: TestHookSettings) -> EngineTestHooks:
        if settings.engine_delay_ms < 0:
            raise EngineConfigError(f"ENGINE_DELAY_MS must be >= 0, got {settings.engine_delay_ms}")
        faults = FaultPlan.parse(settings.engine_faults) if settings.engine_faults.strip() else None
        return cls(faults=faults, delay_ms=settings.engine_delay_ms)

    def wrap(self, engine: Engine) -> Engine:
        """The one place test hooks reach an engine: faults first, then the delay."""
        if self.faults is not None:
            engine = ChaosEngine(engine, self.faults)
        if self.delay_ms:
            engine = SlowEngine(engine, self.delay_ms)
        return engine
