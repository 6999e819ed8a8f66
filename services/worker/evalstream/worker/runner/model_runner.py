"""The model runner: shards in, per-item outcomes out. Knows nothing of Kafka.

For a set of shards it renders every prompt (items.py), serves what it can from the answer
cache, plans length-sorted batches of the misses under the token budget, runs the engine off
the event loop, and grades the answers (grading.py). Items whose engine call failed come back
as transient (to retry) or permanent (to dead-letter) failures. A regrade's shard carries its
answers (`Shard.answers`): they are graded as they are, with no engine and no cache. Items of
a scoring grader are scored instead of answered (scoring.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from evalstream.common import telemetry
from evalstream.common.messages import Shard
from evalstream.common.metrics import (
    BATCH_SIZE,
    ENGINE_BUSY,
    ENGINE_BUSY_SECONDS,
    ENGINE_REQUESTS,
    PADDING_RATIO,
    STAGE_LATENCY,
    TOKENS,
)
from evalstream.common.settings import WorkerSettings
from evalstream.worker.batching import padding_ratio, plan_batches
from evalstream.worker.cache import AnswerCache, CachedAnswer
from evalstream.worker.engines.base import (
    Engine,
    EngineError,
    GenOutput,
    GenRequest,
    guarded_call,
)
from evalstream.worker.grading_pool import GradingPool
from evalstream.worker.runner.grading import grade_all
from evalstream.worker.runner.items import Answered, Failure, Outcome, Pending, prepare, stored_answers
from evalstream.worker.runner.scoring import score_all

log = logging.getLogger("evalstream.worker")
SCORING_CALL_FACTOR = 8  # scoring calls: 8x the batch limits (1,024 requests for hf on a CPU)

Out = TypeVar("Out")


@dataclass
class RunnerConfig:
    group: str
    # (token budget, items) of one engine call for an engine's SPEC and device label: the
    # worker's BATCH_* settings or the measured defaults per engine and device
    batch_limits: Callable[[str, str], tuple[int, int]] = field(
        default_factory=lambda: WorkerSettings().batch_limits
    )


async def start_runner(
    settings: WorkerSettings,
    engine_for: Callable[[str], Engine],
    cache: AnswerCache | None,
    *,
    start_grading: bool = True,
) -> ModelRunner:
    """The worker's runner, with its grading pool's processes started (the string graders run
    off this process, each item under GRADING_TIMEOUT_S; `start_grading=False`: later, by
    `start_grading`, or by the first grading call); `close_grading` stops them."""
    grading = GradingPool(
        settings.grading_processes, settings.grading_timeout_s, settings.grading_memory_mb * 1024 * 1024
    )
    config = RunnerConfig(group=settings.worker_group, batch_limits=settings.batch_limits)
    runner = ModelRunner(config, engine_for, cache, grading)
    if start_grading:
        await runner.start_grading()
    return runner


class ModelRunner:
    def __init__(
        self,
        config: RunnerConfig,
        engine_for: Callable[[str], Engine],
        cache: AnswerCache | None,
        grading: GradingPool | None = None,
    ) -> None:
        self.config = config
        self.grading = grading
        self.engine_for = engine_for
        self.cache = cache
        self.busy_s = 0.0
        self._since = time.monotonic()
        self.recent_latency_ms: list[float] = []
        self.recent_tokens = 0
        self.recent_errors = 0
        self.recent_items = 0
        self.grading_threads: ThreadPoolExecutor | None = None  # made by the first blocking grader

    async def start_grading(self) -> None:
        """Starts the grading pool's processes now, so that the first batch does not wait for them."""
        if self.grading is not None:
            await asyncio.to_thread(self.grading.start)

    async def close_grading(self) -> None:
        """Stops the grading pool's processes (the worker's shutdown)."""
        if self.grading is not None:
            await asyncio.to_thread(self.grading.close)

    async def run(self, shards: list[Shard]) -> Outcome:
        outcome = Outcome(results={s.shard_id: [] for s in shards})
        stored = stored_answers([s for s in shards if s.answers is not None], outcome)
        shards = [s for s in shards if s.answers is None]
        pending, scorings = await asyncio.to_thread(prepare, shards, outcome, self.engine_for)
        # a shard that bypasses the cache (a reproduction) never reads it, even for a key
        # that another shard of the same round looked up
        readers = [p for p in pending if p.key and not p.shard.bypass_cache]
        hits = await self.cache_lookup([p.key for p in readers if p.key])
        cached = {id(p) for p in readers if p.key in hits}
        misses = [p for p in pending if id(p) not in cached]
        answered: list[Answered] = [
            (p, hits[p.key], 0.0, True, False) for p in readers if id(p) in cached and p.key
        ]
        answered += [
            (p, CachedAnswer(p.answer.response, p.answer.prompt_tokens, p.answer.completion_tokens),
             p.answer.latency_ms, p.answer.cache_hit, p.answer.truncated)
            for p in stored
        ]  # fmt: skip
        answered += await self._generate_all(misses, outcome)
        if scorings:
            answered += await score_all(self, scorings, outcome)
        started = time.monotonic()
        graded, ungraded = await asyncio.to_thread(grade_all, self, answered)
        outcome.failures += ungraded
        self.recent_errors += len(ungraded)
        STAGE_LATENCY.labels(stage="grading").observe(time.monotonic() - started)
        for result in graded:
            outcome.results[result.shard_id].append(result)
            self.recent_latency_ms.append(result.latency_ms)
        self.recent_items += len(graded)
        self.recent_latency_ms = self.recent_latency_ms[-2000:]
        self._update_busy()
        return outcome

    async def _generate_all(self, misses: list[Pending], outcome: Outcome) -> list[Answered]:
        """The cache's misses answered by their engines, in batches; the answers cached."""
        answered: list[Answered] = []
        by_engine: dict[int, list[Pending]] = {}
        for p in misses:
            by_engine.setdefault(id(p.engine), []).append(p)
        fresh: list[tuple[str, str, CachedAnswer]] = []
        for group in by_engine.values():
            engine = group[0].engine
            plan = self.plan(
                engine,
                [p.prompt_tokens for p in group],
                max_new_tokens=[p.request.params.max_tokens for p in group],
            )
            for batch_idx in plan:
                batch = [group[i] for i in batch_idx]
                outputs, elapsed = await self.call_engine(
                    engine,
                    batch[0].shard.model,
                    batch[0].request.params,
                    [p.prompt_tokens for p in batch],
                    self._generate,
                    engine,
                    [p.request for p in batch],
                )
                tokens_in = tokens_out = 0
                for p, out in zip(batch, outputs, strict=True):
                    if isinstance(out, EngineError):
                        outcome.failures.append(
                            Failure(p.shard, p.item, f"{type(out).__name__}: {out}", out.transient)
                        )
                        self.recent_errors += 1
                        continue
                    answer = CachedAnswer(
                        out.text, out.prompt_tokens or p.prompt_tokens, out.completion_tokens
                    )
                    answered.append((p, answer, out.latency_ms or elapsed * 1000, False, out.truncated))
                    tokens_in += answer.prompt_tokens
                    tokens_out += answer.completion_tokens
                    if p.key:
                        fresh.append((p.key, engine.name, answer))
                TOKENS.labels(direction="in").inc(tokens_in)
                TOKENS.labels(direction="out").inc(tokens_out)
                self.recent_tokens += tokens_out
        await self.cache_store(fresh)
        return answered

    def plan(
        self,
        engine: Engine,
        lengths: list[int],
        *,
        max_new_tokens: int | Sequence[int] = 0,
        scoring: bool = False,
    ) -> list[list[int]]:
        """An engine's requests (by their lengths in tokens) in batches under its token budget;
        one batch for an API engine, which paces its requests itself (the token budget is a
        device's limit). Scoring requests go in calls SCORING_CALL_FACTOR times as large: the
        engine plans its own passes, and the more of an item's neighbours a call holds, the
        fewer rows it computes only to keep a pass's shape fixed."""
        token_budget, max_items = self.config.batch_limits(engine.name, engine.device)
        if scoring:
            token_budget, max_items = token_budget * SCORING_CALL_FACTOR, max_items * SCORING_CALL_FACTOR
        if getattr(engine, "schedules_itself", False):
            return [list(range(len(lengths)))]
        return plan_batches(
            lengths, token_budget=token_budget, max_items=max_items, max_new_tokens=max_new_tokens
        )

    async def call_engine(
        self,
        engine: Engine,
        model: str,
        params: Any,
        lengths: list[int],
        call: Callable[..., list[Out]],
        *args: Any,
    ) -> tuple[list[Out], float]:
        """`call(*args)`, one engine call on a batch of requests of these lengths, in a thread
        and measured (metrics, a span, the busy time): (its outputs, seconds)."""
        BATCH_SIZE.observe(len(lengths))
        ENGINE_REQUESTS.labels(model=engine.name).inc(len(lengths))
        PADDING_RATIO.observe(padding_ratio(lengths))
        started = time.monotonic()
        with telemetry.engine_span(model, params, len(lengths)) as span:
            outputs = await asyncio.to_thread(call, *args)
            telemetry.record_usage(span, outputs)
        elapsed = time.monotonic() - started
        self.busy_s += elapsed
        ENGINE_BUSY_SECONDS.inc(elapsed)
        STAGE_LATENCY.labels(stage="engine").observe(elapsed)
        return outputs, elapsed

    @staticmethod
    def _generate(engine: Engine, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        return guarded_call(engine.name, engine.generate, requests, "generation")

    async def cache_lookup(self, keys: list[str]) -> dict[str, CachedAnswer]:
        """The cache only saves work: while PostgreSQL is unreachable, everything is a miss."""
        if not self.cache or not keys:
            return {}
        try:
            return await self.cache.get_many(keys)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("answer cache unavailable, treating %d lookups as misses: %s", len(keys), exc)
            return {}

    async def cache_store(self, entries: list[tuple[str, str, CachedAnswer]]) -> None:
        if not self.cache or not entries:
            return
        try:
            await self.cache.put_many(entries)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("answer cache unavailable, %d answers not cached: %s", len(entries), exc)

    def _update_busy(self) -> None:
        now = time.monotonic()
        window = now - self._since
        if window >= 5.0:
            ENGINE_BUSY.set(min(1.0, self.busy_s / window))
            self.busy_s, self._since = 0.0, now

    def take_stats(self) -> tuple[float, float, float, float]:
        """(p50 ms, p95 ms, tokens/s, error rate) since the last call, for heartbeats."""
        self._update_busy()  # heartbeats keep the busy gauge fresh while no batch runs
        lat = sorted(self.recent_latency_ms)
        p50 = lat[len(lat) // 2] if lat else 0.0
        p95 = lat[min(len(lat) - 1, int(len(lat) * 0.95))] if lat else 0.0
        elapsed = max(1e-6, time.monotonic() - getattr(self, "_stats_since", self._since))
        self._stats_since = time.monotonic()
        tps = self.recent_tokens / elapsed
        total = self.recent_items + self.recent_errors
        err = self.recent_errors / total if total else 0.0
        self.recent_tokens = self.recent_errors = self.recent_items = 0
        return p50, p95, tps, err
