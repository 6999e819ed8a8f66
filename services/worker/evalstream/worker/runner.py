"""The model runner: shards in, per-item outcomes out. Knows nothing of Kafka.

For a set of shards it renders every prompt, serves what it can from the answer cache,
plans length-sorted batches of the misses under the token budget, runs the engine off the
event loop, and grades the answers. Items whose engine call failed come back as transient
(to retry) or permanent (to dead-letter) failures. A regrade's shard carries its answers
(`Shard.answers`): they are graded as they are, with no engine and no cache. A raw-prompt
shard (`Shard.raw_prompt`, lm-eval tasks) sends each item's question exactly: no system
prompt, template or chat template; its cache keys are marked raw.

Items graded by a scoring grader (`loglikelihood`, `perplexity`: evalstream.common.scoring)
are scored instead of answered: one engine request per choice (the raw question as the
context, the target delimiter and the choice as the continuation; no template, no system
prompt) or one for the document, each cached under its own score key, planned in batches by
length under the same token budget; the item's scores, as JSON, are its response, which its
grader reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import asyncpg
import msgspec

from evalstream.common import evidence, scoring, telemetry
from evalstream.common.keys import cache_key, score_cache_key
from evalstream.common.messages import ChatMessage, Item, ItemResult, Shard, StoredAnswer
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
from evalstream.worker.cache import AnswerCache, CachedAnswer, score_entry, score_from_entry
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
from evalstream.worker.grading import get_grader, resolve_grader
from evalstream.worker.grading.base import Grade
from evalstream.worker.grading_pool import GradeTask, GradingPool, GradingUnavailable
from evalstream.worker.prompting import build_messages, raw_prompt
from evalstream.worker.sandbox import SandboxUnavailable

log = logging.getLogger("evalstream.worker")
GRADING_THREADS = 8
# Graders that run programs or wait on a model go to threads; the rest is string work on
# untrusted text, done in the grading pool's processes under a per-item deadline (or inline
# where a runner has no pool: tests of the runner alone).
BLOCKING_GRADERS = frozenset({"code", "judge"})


@dataclass
class Failure:
    shard: Shard
    item: Item
    error: str
    transient: bool


@dataclass
class Outcome:
    """What became of one set of shards."""

    results: dict[str, list[ItemResult]] = field(default_factory=dict)  # shard_id -> graded items
    failures: list[Failure] = field(default_factory=list)


@dataclass
class _Pending:
    shard: Shard
    item: Item
    grader: str
    engine: Engine
    request: GenRequest
    prompt: str
    prompt_tokens: int
    key: str | None  # None: not cacheable (sampled generation)


@dataclass
class _Scoring:
    """An item graded by a scoring grader: its engine requests (one per choice, or the
    document) and what became of each."""

    shard: Shard
    item: Item
    grader: str
    engine: Engine
    prompt: str  # the raw context (or document), as the result records the prompt
    rolling: bool
    requests: list[LLRequest] | list[RollingRequest]
    tokens: list[int]  # per request, for batching by length
    keys: list[str | None]  # None: not cacheable
    outputs: list[LLOutput | None] = field(default_factory=list)
    hits: list[bool] = field(default_factory=list)
    error: EngineError | None = None

    def __post_init__(self) -> None:
        self.outputs = [None] * len(self.requests)
        self.hits = [False] * len(self.requests)

    def fail(self, error: EngineError) -> None:
        """Keeps the first permanent error, else the first one: one permanent failure of a
        choice fails the item for good."""
        if self.error is None or (self.error.transient and not error.transient):
            self.error = error


@dataclass
class _Stored:
    """An item of a regrade: its recorded answer, to grade again."""

    shard: Shard
    item: Item
    grader: str
    answer: StoredAnswer


Graded = _Pending | _Stored | _Scoring
Answered = tuple[Graded, CachedAnswer, float, bool, bool]  # (item, answer, latency ms, cache hit, truncated)


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
        self._grading_pool: ThreadPoolExecutor | None = None

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
        stored = self._stored_answers([s for s in shards if s.answers is not None], outcome)
        shards = [s for s in shards if s.answers is None]
        pending, scorings = await asyncio.to_thread(self._prepare, shards, outcome)
        # a shard that bypasses the cache (a reproduction) never reads it, even for a key
        # that another shard of the same round looked up
        readers = [p for p in pending if p.key and not p.shard.bypass_cache]
        hits = await self._cache_lookup([p.key for p in readers if p.key])
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
        by_engine: dict[int, list[_Pending]] = {}
        for p in misses:
            by_engine.setdefault(id(p.engine), []).append(p)
        fresh: list[tuple[str, str, CachedAnswer]] = []
        for group in by_engine.values():
            engine = group[0].engine
            token_budget, max_items = self.config.batch_limits(engine.name, engine.device)
            plan = (
                # an API engine paces its requests itself: the token budget is a device's limit
                [list(range(len(group)))]
                if getattr(engine, "schedules_itself", False)
                else plan_batches(
                    [p.prompt_tokens for p in group],
                    token_budget=token_budget,
                    max_items=max_items,
                    max_new_tokens=[p.request.params.max_tokens for p in group],
                )
            )
            for batch_idx in plan:
                batch = [group[i] for i in batch_idx]
                BATCH_SIZE.observe(len(batch))
                ENGINE_REQUESTS.labels(model=engine.name).inc(len(batch))
                PADDING_RATIO.observe(padding_ratio([p.prompt_tokens for p in batch]))
                started = time.monotonic()
                with telemetry.engine_span(batch[0].shard.model, batch[0].request.params, len(batch)) as span:
                    outputs = await asyncio.to_thread(self._generate, engine, [p.request for p in batch])
                    telemetry.record_usage(span, outputs)
                elapsed = time.monotonic() - started
                self.busy_s += elapsed
                ENGINE_BUSY_SECONDS.inc(elapsed)
                STAGE_LATENCY.labels(stage="engine").observe(elapsed)
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
        await self._cache_store(fresh)
        if scorings:
            answered += await self._score_all(scorings, outcome)
        started = time.monotonic()
        graded, ungraded = await asyncio.to_thread(self._grade_all, answered)
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

    @staticmethod
    def _generate(engine: Engine, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        """An engine that raises instead of returning errors fails its requests transiently,
        so they go through eval.retry and the DLQ instead of looping the whole batch."""
        try:
            outputs = engine.generate(requests)
        except Exception as exc:
            log.exception("engine %s raised on a batch of %d", engine.name, len(requests))
            return [TransientEngineError(f"{type(exc).__name__}: {exc}") for _ in requests]
        if len(outputs) != len(requests):
            error = f"engine {engine.name} returned {len(outputs)} outputs for {len(requests)} requests"
            return [TransientEngineError(error) for _ in requests]
        return outputs

    # ---- log-likelihood scoring

    async def _score_all(self, scorings: list[_Scoring], outcome: Outcome) -> list[Answered]:
        """Scores every request of the scoring items (cache first), then each item's scores
        as its answer; an item with a failed request fails."""
        readers = [(s, j) for s in scorings if not s.shard.bypass_cache for j, k in enumerate(s.keys) if k]
        hits = await self._cache_lookup([k for s, j in readers if (k := s.keys[j])])
        for s, j in readers:
            entry = hits.get(s.keys[j] or "")
            cached = score_from_entry(entry) if entry is not None else None
            if cached is not None:
                s.outputs[j], s.hits[j] = cached, True
        groups: dict[tuple[int, bool], list[tuple[_Scoring, int]]] = {}
        for s in scorings:
            for j, out in enumerate(s.outputs):
                if out is None:
                    groups.setdefault((id(s.engine), s.rolling), []).append((s, j))
        fresh: list[tuple[str, str, CachedAnswer]] = []
        for group in groups.values():
            fresh += await self._score_group(group)
        await self._cache_store(fresh)
        answered: list[Answered] = []
        for s in scorings:
            if s.error is not None:
                error = f"{type(s.error).__name__}: {s.error}"
                outcome.failures.append(Failure(s.shard, s.item, error, s.error.transient))
                self.recent_errors += 1
                continue
            outputs = [o for o in s.outputs if o is not None]
            if len(outputs) != len(s.requests):
                outcome.failures.append(Failure(s.shard, s.item, "TransientEngineError: no score", True))
                continue
            record: scoring.ChoiceScores | scoring.RollingScore
            if s.rolling:
                record = scoring.RollingScore(
                    loglikelihood=outputs[0].loglikelihood, tokens=outputs[0].scored_tokens
                )
            else:
                record = scoring.ChoiceScores(
                    loglikelihoods=[o.loglikelihood for o in outputs],
                    is_greedy=[o.is_greedy for o in outputs],
                    tokens=[o.scored_tokens for o in outputs],
                )
            answer = CachedAnswer(
                scoring.encode_scores(record),
                sum(o.prompt_tokens for o in outputs),
                sum(o.scored_tokens for o in outputs),
            )
            latency = max(o.latency_ms for o in outputs)
            answered.append((s, answer, latency, all(s.hits), any(o.truncated for o in outputs)))
        return answered

    async def _score_group(self, group: list[tuple[_Scoring, int]]) -> list[tuple[str, str, CachedAnswer]]:
        """The requests of one engine and kind, in batches by length under the engine's token
        budget; returns the fresh cache entries."""
        engine, rolling = group[0][0].engine, group[0][0].rolling
        token_budget, max_items = self.config.batch_limits(engine.name, engine.device)
        plan = (
            [list(range(len(group)))]
            if getattr(engine, "schedules_itself", False)
            else plan_batches([s.tokens[j] for s, j in group], token_budget=token_budget, max_items=max_items)
        )
        fresh: list[tuple[str, str, CachedAnswer]] = []
        for batch_idx in plan:
            batch = [group[i] for i in batch_idx]
            BATCH_SIZE.observe(len(batch))
            ENGINE_REQUESTS.labels(model=engine.name).inc(len(batch))
            PADDING_RATIO.observe(padding_ratio([s.tokens[j] for s, j in batch]))
            requests = [s.requests[j] for s, j in batch]
            started = time.monotonic()
            with telemetry.engine_span(
                batch[0][0].shard.model, batch[0][0].shard.generation, len(batch)
            ) as span:
                outputs = await asyncio.to_thread(self._score, engine, rolling, requests)
                telemetry.record_usage(span, outputs)
            elapsed = time.monotonic() - started
            self.busy_s += elapsed
            ENGINE_BUSY_SECONDS.inc(elapsed)
            STAGE_LATENCY.labels(stage="engine").observe(elapsed)
            tokens_in = 0
            for (s, j), out in zip(batch, outputs, strict=True):
                if isinstance(out, EngineError):
                    s.fail(out)
                    continue
                if not out.latency_ms:
                    out = LLOutput(
                        out.loglikelihood,
                        out.is_greedy,
                        out.prompt_tokens,
                        out.scored_tokens,
                        out.truncated,
                        elapsed * 1000,
                    )
                s.outputs[j] = out
                tokens_in += out.prompt_tokens
                if (key := s.keys[j]) is not None:
                    fresh.append((key, engine.name, score_entry(out)))
            TOKENS.labels(direction="in").inc(tokens_in)
        return fresh

    @staticmethod
    def _score(
        engine: Engine, rolling: bool, requests: Sequence[LLRequest | RollingRequest]
    ) -> list[LLOutput | EngineError]:
        """Like _generate: an engine that raises fails its requests transiently; one that
        does not score at all fails them for good."""
        method = getattr(engine, "loglikelihood_rolling" if rolling else "loglikelihood", None)
        if method is None:
            why = f"engine {engine.name} does not score log-likelihoods"
            return [PermanentEngineError(why) for _ in requests]
        try:
            outputs: list[LLOutput | EngineError] = method(list(requests))
        except Exception as exc:
            log.exception("engine %s raised on a scoring batch of %d", engine.name, len(requests))
            return [TransientEngineError(f"{type(exc).__name__}: {exc}") for _ in requests]
        if len(outputs) != len(requests):
            error = f"engine {engine.name} returned {len(outputs)} scores for {len(requests)} requests"
            return [TransientEngineError(error) for _ in requests]
        return outputs

    def _scoring(self, shard: Shard, item: Item, grader: str, engine: Engine) -> _Scoring:
        """The scoring requests of an item (raises ValueError for one that cannot be scored)."""
        rolling = grader == scoring.PERPLEXITY
        problem = (scoring.perplexity_problem if rolling else scoring.loglikelihood_problem)(item)
        if problem:
            raise ValueError(problem)
        context = item.question or ""
        requests: list[LLRequest] | list[RollingRequest]
        if rolling:
            requests = [RollingRequest(item.id, context, attempt=shard.attempt)]
            kind = f"loglikelihood_rolling/{getattr(engine, 'context_window', 0)}"
            pairs = [("", context)]
        else:
            conts = scoring.continuations(item)
            requests = [
                LLRequest(item.id, context, c, index=i, attempt=shard.attempt) for i, c in enumerate(conts)
            ]
            kind = "loglikelihood"
            pairs = [(context, c) for c in conts]
        keys: list[str | None] = [
            score_cache_key(
                model=engine.name, model_revision=engine.revision, kind=kind, context=c, continuation=t
            )
            if engine.cacheable
            else None
            for c, t in pairs
        ]
        tokens = [max(1, engine.count_tokens(c + t)) for c, t in pairs]
        return _Scoring(shard, item, grader, engine, context, rolling, requests, tokens, keys)

    async def _cache_lookup(self, keys: list[str]) -> dict[str, CachedAnswer]:
        """The cache only saves work: while PostgreSQL is unreachable, everything is a miss."""
        if not self.cache or not keys:
            return {}
        try:
            return await self.cache.get_many(keys)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("answer cache unavailable, treating %d lookups as misses: %s", len(keys), exc)
            return {}

    async def _cache_store(self, entries: list[tuple[str, str, CachedAnswer]]) -> None:
        if not self.cache or not entries:
            return
        try:
            await self.cache.put_many(entries)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("answer cache unavailable, %d answers not cached: %s", len(entries), exc)

    @staticmethod
    def _stored_answers(shards: list[Shard], outcome: Outcome) -> list[_Stored]:
        """A regrade's items with their recorded answers (an item without one fails)."""
        out = []
        for shard in shards:
            answers = {a.item_id: a for a in shard.answers or []}
            for item in shard.items:
                try:
                    out.append(_Stored(shard, item, resolve_grader(shard.grader, item), answers[item.id]))
                except KeyError:
                    outcome.failures.append(Failure(shard, item, "regrade: no recorded answer", False))
                except Exception as exc:  # a bad item must not sink its shard
                    outcome.failures.append(Failure(shard, item, f"{type(exc).__name__}: {exc}", False))
        return out

    def _prepare(self, shards: list[Shard], outcome: Outcome) -> tuple[list[_Pending], list[_Scoring]]:
        pending = []
        scorings: list[_Scoring] = []
        for shard in shards:
            # the router's SLA fallback may hand the shard to a lighter model than requested
            model = shard.served_model or shard.model
            generation = msgspec.to_builtins(shard.generation)  # once per shard: part of every cache key
            if shard.raw_prompt:
                # a raw prompt's answer never shares a key with a chat prompt of the same text
                # (an API engine sends them to different endpoints)
                generation["raw_prompt"] = True
            for item in shard.items:
                try:
                    engine = self.engine_for(model)
                    grader = resolve_grader(shard.grader, item)
                    if grader in scoring.SCORING_GRADERS:
                        scorings.append(self._scoring(shard, item, grader, engine))
                        continue
                    raw: str | None = None
                    if shard.raw_prompt:
                        prompt = raw = raw_prompt(item)
                        messages = [ChatMessage("user", raw)]
                    else:
                        messages = build_messages(shard, item, grader)
                        prompt = engine.render_prompt(messages)
                    n_tokens = engine.count_tokens(prompt)
                except EngineError as exc:
                    outcome.failures.append(
                        Failure(shard, item, f"{type(exc).__name__}: {exc}", exc.transient)
                    )
                    continue
                except Exception as exc:  # a bad item must not sink its shard
                    outcome.failures.append(Failure(shard, item, f"{type(exc).__name__}: {exc}", False))
                    continue
                gen = shard.generation
                key = None
                if gen.temperature == 0.0 and engine.cacheable:
                    # the engine's own SPEC: a bundled model's name shares the answers of the
                    # engine it resolves to (the revision tells engines and precisions apart)
                    key = cache_key(
                        model=engine.name,
                        model_revision=engine.revision,
                        generation=generation,
                        prompt=prompt,
                    )
                request = GenRequest(
                    item_id=item.id, messages=messages, params=gen, attempt=shard.attempt, prompt=raw
                )
                pending.append(_Pending(shard, item, grader, engine, request, prompt, n_tokens, key))
        return pending, scorings

    def _grade_all(self, answered: list[Answered]) -> tuple[list[ItemResult], list[Failure]]:
        blocking = [e for e in answered if e[0].grader.split(":", 1)[0] in BLOCKING_GRADERS]
        strings = [e for e in answered if e[0].grader.split(":", 1)[0] not in BLOCKING_GRADERS]
        if self.grading is None:
            graded = [self._grade_one(e) for e in strings]
        else:
            graded = self._grade_in_pool(self.grading, strings)
        if blocking:
            # a few threads: code runs in sandbox processes and a judge waits on its model
            if self._grading_pool is None:
                self._grading_pool = ThreadPoolExecutor(GRADING_THREADS, thread_name_prefix="grading")
            graded += self._grading_pool.map(self._grade_one, blocking)
        return [g for g in graded if isinstance(g, ItemResult)], [g for g in graded if isinstance(g, Failure)]

    def _grade_in_pool(self, pool: GradingPool, entries: list[Answered]) -> list[ItemResult | Failure]:
        """Graded in the pool's processes. A reply's error (a grader that failed, overran its
        deadline or crashed) fails its item for good: the same answer would do it again."""
        tasks = [GradeTask(e[0].grader, e[1].response, e[0].item) for e in entries]
        try:
            replies = pool.grade(tasks)
        except GradingUnavailable as exc:  # this worker's fault: another attempt may go elsewhere
            return [Failure(e[0].shard, e[0].item, f"{type(exc).__name__}: {exc}", True) for e in entries]
        return [
            self._result(e, r.grade)
            if r.grade is not None
            else Failure(e[0].shard, e[0].item, r.error or "", False)
            for e, r in zip(entries, replies, strict=True)
        ]

    def _grade_one(self, entry: Answered) -> ItemResult | Failure:
        p, answer = entry[0], entry[1]
        try:
            # Graders clean what they read themselves (think blocks, fences): cleaning here
            # would strip a code body's first-line indentation.
            grade = get_grader(p.grader, p.item)(answer.response, p.item)
        except EngineError as exc:  # a judge's model failed: retried like the item's own
            return Failure(p.shard, p.item, f"{type(exc).__name__}: {exc}", exc.transient)
        except SandboxUnavailable as exc:  # this worker's fault: another attempt may go elsewhere
            return Failure(p.shard, p.item, f"{type(exc).__name__}: {exc}", True)
        except Exception as exc:  # an item that cannot be graded must not sink its shard
            return Failure(p.shard, p.item, f"{type(exc).__name__}: {exc}", False)
        return self._result(entry, grade)

    def _result(self, entry: Answered, grade: Grade) -> ItemResult:
        p, answer, latency_ms, cache_hit, truncated = entry
        if isinstance(p, _Stored):  # a regrade: only the grade is new
            served_by, revision, attempts, prompt = (
                p.answer.served_by, p.answer.model_revision, p.answer.attempts, p.answer.prompt
            )  # fmt: skip
        else:
            served_by, revision = f"{self.config.group}/{p.engine.name}", p.engine.revision
            attempts, prompt = p.shard.attempt, p.prompt
        return ItemResult(
            run_id=p.shard.run_id,
            item_id=p.item.id,
            shard_id=p.shard.shard_id,
            response=answer.response,
            extracted=grade.extracted,
            correct=None if grade.ungraded else grade.correct,
            score=grade.score,
            attempts=attempts,
            cache_hit=cache_hit,
            latency_ms=latency_ms,
            served_by=served_by,
            model_revision=revision,
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            truncated=truncated,
            category=p.item.category,
            question=evidence.question_of(p.item),
            gold=evidence.gold_of(p.item),
            prompt=evidence.clip(prompt, evidence.MAX_PROMPT_CHARS),
            detail=evidence.clip(grade.detail, evidence.MAX_DETAIL_CHARS),
            evidence=evidence.clip(grade.evidence, evidence.MAX_EVIDENCE_CHARS),
            correct_norm=grade.correct_norm,
            loglikelihood=grade.loglikelihood,
            doc_words=grade.doc_words,
            doc_bytes=grade.doc_bytes,
        )

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
