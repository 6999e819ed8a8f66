"""A regrade's two halves: the aggregator's plan (aggregator/regrade.py: what a Regrade
request becomes before anything is written, which requests are refused) and the worker's
grading of the shards it publishes (no engine)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec

from evalstream.aggregator.regrade import item_problems, plan, request_problems
from evalstream.common.messages import Item, Regrade
from evalstream.worker.runner import ModelRunner, RunnerConfig

ORIGINAL = {
    "run_id": "run-a",
    "name": "a",
    "status": "completed",
    "model": "replay:/x.jsonl",
    "spec": json.dumps(
        {"worker_group": "g1", "generation": {"max_tokens": 32}, "retry": {"max_attempts": 5}}
    ),
    "manifest": "{}",
}
ITEMS = {i: Item(id=i, question=f"q{i}?", answer=a) for i, a in (("1", "4"), ("2", "Paris"), ("3", "x"))}


def row(
    item_id: str, shard: str, response: str | None, error: str | None = None, **kw: Any
) -> dict[str, Any]:
    base = dict.fromkeys(
        ("extracted", "correct", "latency_ms", "served_by", "model_revision", "prompt_tokens",
         "completion_tokens", "truncated", "attempts", "prompt", "category", "question", "gold",
         "detail", "evidence", "cache_hit"),
    )  # fmt: skip
    return {
        **base, "run_id": "run-a", "item_id": item_id, "shard_id": shard, "response": response,
        "error": error, "score": 0.0, **kw,
    }  # fmt: skip


ROWS = [
    row("1", "run-a-s00000", "4", served_by="g1/replay", attempts=2, latency_ms=12.5, prompt_tokens=7),
    row("2", "run-a-s00000", None, error="engine failed"),
    row("3", "run-a-s00001", "Lyon", cache_hit=True),
]


def test_answers_become_shards_and_failures_stay_failures() -> None:
    request = Regrade(run_id="run-a", new_run_id="run-b", grader="contains")
    todo = plan(request, ORIGINAL, ROWS, ITEMS)
    assert [(f.run_id, f.item_id, f.shard_id, f.error) for f in todo.failures] == [
        ("run-b", "2", "run-b-s00000", "engine failed")
    ]
    assert [(s.run_id, s.shard_id, s.shard_index, s.shard_count) for s in todo.shards] == [
        ("run-b", "run-b-s00000", 0, 2),
        ("run-b", "run-b-s00001", 1, 2),
    ]
    first = todo.shards[0]
    assert (first.model, first.grader, first.worker_group) == ("replay:/x.jsonl", "contains", "g1")
    assert (first.generation.max_tokens, first.retry.max_attempts) == (32, 5)
    assert [i.id for i in first.items] == ["1"]
    assert first.answers is not None
    (answer,) = first.answers
    assert (answer.response, answer.served_by, answer.attempts, answer.latency_ms, answer.prompt_tokens) == (
        "4", "g1/replay", 2, 12.5, 7,
    )  # fmt: skip
    assert todo.shards[1].answers is not None and todo.shards[1].answers[0].cache_hit


def test_the_request_may_name_the_grading_group() -> None:
    request = Regrade(run_id="run-a", new_run_id="run-b", grader="exact", worker_group="cpu-graders")
    assert {s.worker_group for s in plan(request, ORIGINAL, ROWS, ITEMS).shards} == {"cpu-graders"}


def test_bad_requests_are_refused() -> None:
    ok = Regrade(run_id="run-a", new_run_id="run-b", grader="exact")
    assert request_problems(ok, ORIGINAL) == []
    assert request_problems(ok, None) == ["no run 'run-a'"]
    running = {**ORIGINAL, "status": "running"}
    assert request_problems(ok, running) == ["run run-a is running: only a completed run can be regraded"]
    assert (
        "unknown grader 'fuzzy'"
        in request_problems(Regrade(run_id="run-a", new_run_id="b", grader="fuzzy"), ORIGINAL)[0]
    )
    same = Regrade(run_id="run-a", new_run_id="run-a", grader="exact")
    assert request_problems(same, ORIGINAL)[0].startswith("new_run_id must be a new run id")


def test_items_the_grader_cannot_grade_are_named() -> None:
    # only answered items count: item 2 failed, so its gold is never graded
    assert item_problems("numeric", ROWS, ITEMS) == ["item 3: gold answer 'x' is not a number"]
    assert item_problems("exact", ROWS, ITEMS) == []
    assert item_problems("exact", ROWS, {"1": ITEMS["1"]}) == ["item 3: not in the run's dataset copy"]


def test_a_worker_grades_a_regrade_shard_without_an_engine() -> None:
    """The worker's side: the recorded answers are graded as they are (no engine is even
    asked for), each result keeps what the original recorded, and an item without an
    answer fails for good."""

    def engine_for(spec: str) -> Any:
        raise AssertionError(f"a regrade asked for engine {spec}")

    request = Regrade(run_id="run-a", new_run_id="run-b", grader="contains")
    (shard, second) = plan(request, ORIGINAL, ROWS, ITEMS).shards
    shard = msgspec.structs.replace(shard, items=[*shard.items, ITEMS["2"]])  # "2" has no answer
    outcome = asyncio.run(
        ModelRunner(RunnerConfig(group="graders"), engine_for, cache=None).run([shard, second])
    )
    (one,) = outcome.results["run-b-s00000"]
    assert (one.item_id, one.response, one.correct, one.served_by, one.attempts, one.latency_ms) == (
        "1", "4", True, "g1/replay", 2, 12.5,
    )  # fmt: skip
    (three,) = outcome.results["run-b-s00001"]
    assert (three.correct, three.cache_hit) == (False, True)
    assert [(f.item.id, f.error, f.transient) for f in outcome.failures] == [
        ("2", "regrade: no recorded answer", False)
    ]
