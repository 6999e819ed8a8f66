"""What the runner works on: an item waiting for its engine (Pending), a regrade's item with
its recorded answer (Stored), a scoring grader's item with its log-likelihood requests
(ScoringItem), and what became of a set of shards (Outcome, Failure). `prepare` turns shards
into that work: prompts rendered and counted, cache keys made. A raw-prompt shard
(`Shard.raw_prompt`, lm-eval tasks) sends each item's question exactly: no system prompt,
template or chat template; its cache keys are marked raw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from evalstream.common import scoring
from evalstream.common.keys import cache_key, score_cache_key
from evalstream.common.messages import ChatMessage, Item, ItemResult, Shard, StoredAnswer
from evalstream.worker.cache import CachedAnswer
from evalstream.worker.engines.base import (
    Engine,
    EngineError,
    GenRequest,
    LLOutput,
    LLRequest,
    RollingRequest,
)
from evalstream.worker.grading import resolve_grader
from evalstream.worker.prompting import build_messages, raw_prompt


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
class Pending:
    shard: Shard
    item: Item
    grader: str
    engine: Engine
    request: GenRequest
    prompt: str
    prompt_tokens: int
    key: str | None  # None: not cacheable (sampled generation)


@dataclass
class ScoringItem:
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
class Stored:
    """An item of a regrade: its recorded answer, to grade again."""

    shard: Shard
    item: Item
    grader: str
    answer: StoredAnswer


Graded = Pending | Stored | ScoringItem
Answered = tuple[Graded, CachedAnswer, float, bool, bool]  # (item, answer, latency ms, cache hit, truncated)


def stored_answers(shards: list[Shard], outcome: Outcome) -> list[Stored]:
    """A regrade's items with their recorded answers (an item without one fails)."""
    out = []
    for shard in shards:
        answers = {a.item_id: a for a in shard.answers or []}
        for item in shard.items:
            try:
                out.append(Stored(shard, item, resolve_grader(shard.grader, item), answers[item.id]))
            except KeyError:
                outcome.failures.append(Failure(shard, item, "regrade: no recorded answer", False))
            except Exception as exc:  # a bad item must not sink its shard
                outcome.failures.append(Failure(shard, item, f"{type(exc).__name__}: {exc}", False))
    return out


def prepare(
    shards: list[Shard], outcome: Outcome, engine_for: Callable[[str], Engine]
) -> tuple[list[Pending], list[ScoringItem]]:
    """Each item of `shards` as engine work: its prompt rendered and counted and its cache
    key made (a scoring grader's item: its scoring requests); an item that cannot be
    prepared fails into `outcome`."""
    pending = []
    scorings: list[ScoringItem] = []
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
                engine = engine_for(model)
                grader = resolve_grader(shard.grader, item)
                if grader in scoring.SCORING_GRADERS:
                    scorings.append(scoring_item(shard, item, grader, engine))
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
                outcome.failures.append(Failure(shard, item, f"{type(exc).__name__}: {exc}", exc.transient))
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
            pending.append(Pending(shard, item, grader, engine, request, prompt, n_tokens, key))
    return pending, scorings


def scoring_item(shard: Shard, item: Item, grader: str, engine: Engine) -> ScoringItem:
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
    return ScoringItem(shard, item, grader, engine, context, rolling, requests, tokens, keys)
