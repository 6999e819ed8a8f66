"""Regrading a completed run, on request (messages.Regrade on eval.control, which `evalctl
regrade` publishes): a new run whose items are the original's recorded answers graded
again by a worker group, with no model call. The aggregator owns the tables, so it is the
one that makes the run; graders (the code sandbox, judges and their keys) are the workers'.

1. The request is checked (the original completed, the grader SPEC, every answered item
   gradable by it); a bad one leaves the new run `rejected` with its problems.
2. The new run is created `publishing` (its manifest is the original's with the grader
   replaced and `regrade_of`), the original's failed items are copied as its failures,
   and each original shard's answers go to eval.shards as a shard carrying them
   (`Shard.answers`); the router hands them to a worker group, which grades and publishes
   to eval.results, where they are recorded like any result (idempotently, by item).
3. The run becomes `running`; it completes like any run once every item has its row.

Redelivery: a request for a run that exists is acted on again only while that run is still
`publishing` (the aggregator died before it had published everything): its shards are
published again and the sinks drop what was already recorded. Once `running`, `completed`
or `rejected`, a redelivered request changes nothing - no second grading, no count added.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

import msgspec
from minio import Minio

from evalstream.aggregator.sink import ResultSink, Window
from evalstream.aggregator.store import ResultStore, Sourced
from evalstream.common.gold import item_problem
from evalstream.common.graders import grader_problem
from evalstream.common.manifest import manifest_sha256, request_from_manifest
from evalstream.common.messages import (
    GenerationParams,
    Item,
    ItemResult,
    Regrade,
    RetryPolicy,
    Shard,
    StoredAnswer,
)
from evalstream.common.names import plain_name_problem
from evalstream.common.regrading import StoredCopyError, regraded_manifest, run_items
from evalstream.common.results import RESULT_COLUMNS

log = logging.getLogger("evalstream.aggregator.regrade")

# many shards at once (consume.Aggregator.publish)
Publish = Callable[[Iterable[Shard] | AsyncIterable[Shard]], Awaitable[None]]
MAX_PROBLEMS = 50  # of a rejected regrade, listed in runs.problems
BY_SHARD = "shard_id, item_id"  # the order answers are read in: a shard's rows together
# what a shard of answers carries of each row (stored_answer)
ANSWER_COLUMNS = (
    "item_id",
    "shard_id",
    "response",
    "latency_ms",
    "cache_hit",
    "served_by",
    "model_revision",
    "prompt_tokens",
    "completion_tokens",
    "truncated",
    "attempts",
    "prompt",
)


@dataclass(frozen=True)
class Plan:
    """A regrade's new run: its failures (copied) and the shards of answers to grade."""

    failures: list[ItemResult]
    shards: list[Shard]


def stored_answer(row: Mapping[str, Any]) -> StoredAnswer:
    return StoredAnswer(
        item_id=row["item_id"],
        response=row["response"],
        latency_ms=row["latency_ms"] or 0.0,
        cache_hit=bool(row["cache_hit"]),
        served_by=row["served_by"] or "",
        model_revision=row["model_revision"] or "",
        prompt_tokens=row["prompt_tokens"] or 0,
        completion_tokens=row["completion_tokens"] or 0,
        truncated=bool(row["truncated"]),
        attempts=row["attempts"] or 1,
        prompt=row["prompt"],
    )


def answered(row: Mapping[str, Any]) -> bool:
    """store.ANSWERED, the same rule in SQL, picks these rows when they are streamed."""
    return row["error"] is None and row["response"] is not None


def plan(
    request: Regrade,
    original: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    items: Mapping[str, Item],
) -> Plan:
    """The new run's failures and shards: one shard per original shard that has answers
    (the same items together), each item with its recorded answer. (regrade_run does the
    same from rows streamed out of the database, never all of them at once.)"""
    answers = sorted((r for r in rows if answered(r)), key=lambda r: (r["shard_id"], r["item_id"]))
    shards = ShardMaker(request, original, items, len({r["shard_id"] for r in answers}))
    made = [shards.make(list(group)) for _, group in itertools.groupby(answers, key=lambda r: r["shard_id"])]
    return Plan([failure(request, r) for r in rows if not answered(r)], made)


def new_shard_id(request: Regrade, original_shard: str) -> str:
    return f"{request.new_run_id}-{original_shard.removeprefix(request.run_id + '-')}"


def failure(request: Regrade, row: Mapping[str, Any]) -> ItemResult:
    """An unanswered item's recorded failure, copied into the new run."""
    columns = set(row.keys())  # a dict's or a database record's
    return ItemResult(
        **{
            **{k: row[k] for k in ItemResult.__struct_fields__ if k in columns},
            "run_id": request.new_run_id,
            "shard_id": new_shard_id(request, row["shard_id"]),
        }
    )


class ShardMaker:
    """The new run's shards, one per original shard with answers, in the order they are
    asked for (sorted by original shard id: shard_index counts them)."""

    def __init__(
        self, request: Regrade, original: Mapping[str, Any], items: Mapping[str, Item], count: int
    ) -> None:
        spec = json.loads(original["spec"] or "{}")
        self.request = request
        self.model = original["model"]
        self.items = items
        self.count = count
        self.index = 0
        self.generation = msgspec.convert(spec.get("generation") or {}, GenerationParams)
        self.retry = msgspec.convert(spec.get("retry") or {}, RetryPolicy)
        self.worker_group = request.worker_group or spec.get("worker_group")

    def make(self, rows: Sequence[Mapping[str, Any]]) -> Shard:
        """The shard of one original shard's answered rows (sorted by item id)."""
        shard = Shard(
            run_id=self.request.new_run_id,
            shard_id=new_shard_id(self.request, rows[0]["shard_id"]),
            shard_index=self.index,
            shard_count=self.count,
            model=self.model,
            grader=self.request.grader,
            generation=self.generation,
            items=[self.items[r["item_id"]] for r in rows],
            retry=self.retry,
            worker_group=self.worker_group,
            answers=[stored_answer(r) for r in rows],
        )
        self.index += 1
        return shard


async def _groups(rows: AsyncIterable[Mapping[str, Any]]) -> AsyncIterator[list[Mapping[str, Any]]]:
    """Consecutive rows of the same original shard, together."""
    group: list[Mapping[str, Any]] = []
    async for r in rows:
        if group and r["shard_id"] != group[0]["shard_id"]:
            yield group
            group = []
        group.append(r)
    if group:
        yield group


def request_problems(request: Regrade, original: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with the request before any item is read."""
    out = []
    if problem := plain_name_problem(request.new_run_id, "new_run_id"):
        out.append(problem)
    elif request.new_run_id == request.run_id:
        out.append("new_run_id must be a new run id")
    if original is None:
        out.append(f"no run {request.run_id!r}")
    elif original["status"] != "completed" or original["manifest"] is None:
        out.append(f"run {request.run_id} is {original['status']}: only a completed run can be regraded")
    if problem := grader_problem(request.grader):
        out.append(problem)
    return out


def item_problems(grader: str, rows: Iterable[Mapping[str, Any]], items: Mapping[str, Item]) -> list[str]:
    """Why answered items cannot be graded by `grader` (an answer without an item in the
    dataset copy included)."""
    return [p for r in rows if answered(r) and (p := answer_problem(grader, r, items))]


def answer_problem(grader: str, row: Mapping[str, Any], items: Mapping[str, Item]) -> str | None:
    item = items.get(row["item_id"])
    if item is None:
        return f"item {row['item_id']}: not in the run's dataset copy"
    return item_problem(grader, item)


async def regrade_run(
    store: ResultStore, s3: Minio, sink: ResultSink, request: Regrade, source: str, publish: Publish
) -> None:
    """Acts on `request`, the eval.control record at `source` (the copied failures' rows
    come from it, for the sink's exactly-once mirror)."""
    existing = await store.run_state(request.new_run_id)
    if existing is not None:
        status, regrade_of = existing
        if regrade_of != request.run_id:
            log.warning(
                "regrade to %s ignored: that run exists and regrades no %s",
                request.new_run_id,
                request.run_id,
            )
            return
        if status != "publishing":
            log.info("regrade %s redelivered: the run is %s, nothing to do", request.new_run_id, status)
            return
    original = await store.run_row(request.run_id)
    if problems := request_problems(request, original):
        await reject(store, request, problems)
        return
    assert original is not None
    manifest = json.loads(original["manifest"])
    try:
        items = {i.id: i for i in await asyncio.to_thread(run_items, s3, request_from_manifest(manifest))}
    except StoredCopyError as exc:
        await reject(store, request, [str(exc)])
        return
    async with store.snapshot() as conn:
        # 1. every answer gradable by the grader (their items, nothing else, read)
        unanswerable: list[str] = []
        shard_count = 0
        async for group in _groups(
            store.streamed_rows(conn, request.run_id, ("item_id", "shard_id"), answered=True, order=BY_SHARD)
        ):
            shard_count += 1
            unanswerable.extend(p for r in group if (p := answer_problem(request.grader, r, items)))
        if unanswerable:
            await reject(store, request, unanswerable)
            return
        new_manifest = regraded_manifest(
            manifest, request.run_id, original["manifest_sha256"], request.grader
        )
        spec = {
            **json.loads(original["spec"] or "{}"),
            "grader": request.grader,
            "run_id": request.new_run_id,
        }
        spec["regrade_of"] = request.run_id
        await store.create_regrade_run(
            request.new_run_id,
            original,
            name=f"{original['name'] or original['run_id']} (regraded: {request.grader})",
            grader=request.grader,
            spec=spec,
            manifest=new_manifest,
            digest=manifest_sha256(new_manifest),
        )
        # 2. the copied failures: rows, Parquet, Delta, and the run's completion if every item
        # failed (one window: they share the request's record as their source)
        failures = [
            failure(request, r)
            async for r in store.streamed_rows(conn, request.run_id, RESULT_COLUMNS, answered=False)
        ]
        await sink.record(Window([Sourced(f, source) for f in failures]))
        # 3. the answers, a shard per original shard, published as they are read
        maker = ShardMaker(request, original, items, shard_count)
        answers = 0

        async def shards() -> AsyncIterator[Shard]:
            nonlocal answers
            rows = store.streamed_rows(conn, request.run_id, ANSWER_COLUMNS, answered=True, order=BY_SHARD)
            async for group in _groups(rows):
                answers += len(group)
                yield maker.make(group)

        await publish(shards())
    await store.mark_published(request.new_run_id)
    log.info(
        "regrade %s of %s with %s: %d answer(s) in %d shard(s) published, %d failure(s) copied",
        request.new_run_id,
        request.run_id,
        request.grader,
        answers,
        maker.index,
        len(failures),
    )


async def reject(store: ResultStore, request: Regrade, problems: list[str]) -> None:
    log.warning("regrade %s of %s rejected: %s", request.new_run_id, request.run_id, problems[:3])
    if plain_name_problem(request.new_run_id, "new_run_id") or request.new_run_id == request.run_id:
        return  # no run of its own to leave the problems on
    shown = problems[:MAX_PROBLEMS]
    if len(problems) > MAX_PROBLEMS:
        shown.append(f"... and {len(problems) - MAX_PROBLEMS} more")
    await store.reject_regrade(
        request.new_run_id,
        request.run_id,
        request.grader,
        [{"line": None, "field": "regrade", "message": p} for p in shown],
    )
