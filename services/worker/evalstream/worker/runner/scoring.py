"""Items graded by a scoring grader (`loglikelihood`, `perplexity`: evalstream.common.scoring)
are scored instead of answered: one engine request per choice (the raw question as the
context, the target delimiter and the choice as the continuation; no template, no system
prompt) or one for the document, each cached under its own score key, planned in batches by
length under the same token budget; the item's scores, as JSON, are its response, which its
grader reads. The requests are made by items.scoring_item.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from evalstream.common import scoring
from evalstream.common.metrics import TOKENS
from evalstream.worker.cache import CachedAnswer, score_entry, score_from_entry
from evalstream.worker.engines.base import (
    Engine,
    EngineError,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    guarded_call,
)
from evalstream.worker.runner.items import Answered, Failure, Outcome, ScoringItem

if TYPE_CHECKING:
    from evalstream.worker.runner.model_runner import ModelRunner

log = logging.getLogger("evalstream.worker")


async def score_all(runner: ModelRunner, scorings: list[ScoringItem], outcome: Outcome) -> list[Answered]:
    """Scores every request of the scoring items (cache first), then each item's scores
    as its answer; an item with a failed request fails."""
    readers = [(s, j) for s in scorings if not s.shard.bypass_cache for j, k in enumerate(s.keys) if k]
    hits = await runner.cache_lookup([k for s, j in readers if (k := s.keys[j])])
    for s, j in readers:
        entry = hits.get(s.keys[j] or "")
        cached = score_from_entry(entry) if entry is not None else None
        if cached is not None:
            s.outputs[j], s.hits[j] = cached, True
    groups: dict[tuple[int, bool], list[tuple[ScoringItem, int]]] = {}
    for s in scorings:
        for j, out in enumerate(s.outputs):
            if out is None:
                groups.setdefault((id(s.engine), s.rolling), []).append((s, j))
    fresh: list[tuple[str, str, CachedAnswer]] = []
    for group in groups.values():
        fresh += await score_group(runner, group)
    await runner.cache_store(fresh)
    answered: list[Answered] = []
    for s in scorings:
        if s.error is not None:
            error = f"{type(s.error).__name__}: {s.error}"
            outcome.failures.append(Failure(s.shard, s.item, error, s.error.transient))
            runner.recent_errors += 1
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


async def score_group(
    runner: ModelRunner, group: list[tuple[ScoringItem, int]]
) -> list[tuple[str, str, CachedAnswer]]:
    """The requests of one engine and kind, in batches by length under the engine's token
    budget; returns the fresh cache entries."""
    engine, rolling = group[0][0].engine, group[0][0].rolling
    plan = runner.plan(engine, [s.tokens[j] for s, j in group], scoring=True)
    fresh: list[tuple[str, str, CachedAnswer]] = []
    for batch_idx in plan:
        batch = [group[i] for i in batch_idx]
        outputs, elapsed = await runner.call_engine(
            engine,
            batch[0][0].shard.model,
            batch[0][0].shard.generation,
            [s.tokens[j] for s, j in batch],
            score,
            engine,
            rolling,
            [s.requests[j] for s, j in batch],
        )
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


def score(
    engine: Engine, rolling: bool, requests: Sequence[LLRequest | RollingRequest]
) -> list[LLOutput | EngineError]:
    """The engine's scores (engines.base.guarded_call); an engine that does not score at all
    fails the requests for good."""
    method = getattr(engine, "loglikelihood_rolling" if rolling else "loglikelihood", None)
    if method is None:
        why = f"engine {engine.name} does not score log-likelihoods"
        return [PermanentEngineError(why) for _ in requests]
    return guarded_call(engine.name, method, requests, "scoring")
