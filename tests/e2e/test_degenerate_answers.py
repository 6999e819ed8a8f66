"""Grading can't hang a worker, poison shards end, hostile jobs are refused (issue 12), on the
real stack.

* Degenerate answers, replayed, through every built-in string grader: each item ends with a
  grade (not a timeout) while the worker's /healthz answers all along; a user pattern that
  backtracks forever fails its item alone, with the deadline named.
* A shard whose processing fails on every delivery is dead-lettered after
  WORKER_MAX_DELIVERIES and its items end as recorded failures; the rest of the run is graded.
* Jobs naming local paths, other buckets, bad run ids or oversized envelopes are rejected
  with a clear message and publish nothing (a bad run id's run is recorded under an id
  derived from the job's place in Kafka).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common import topics
from evalstream.common.messages import JobSpec, encode
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.degenerate import DEGENERATE
from tests.e2e.helpers import arithmetic_items, evalctl, write_jsonl
from tests.replay_files import replay_dir, replay_env
from tests.support import (
    admin_settings,
    read_topic_since,
    topic_end_offsets,
    unique,
    upload_dataset,
    wait_until,
)

pytestmark = pytest.mark.stack

GRADING_TIMEOUT_S = 3.0
BOMB_PATTERN = r"(a|aa)+\1$"  # a backreference: Python's engine only, exponential on "a" * 60 + "!"


def _run_id(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


async def _final_status(pg: asyncpg.Connection, run_id: str) -> str:
    async def done() -> bool:
        status = await pg.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
        return status in ("completed", "rejected", "failed")

    await wait_until(done, 300, what=f"run {run_id} to end")
    return str(await pg.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id))


async def _poll_health(port: int, stop: asyncio.Event, misses: list[str]) -> int:
    """Polls the worker's /healthz until `stop`; each probe that fails or takes over a second
    (a liveness probe's timeout) is a miss. Returns how many probes answered."""
    answered = 0
    async with httpx.AsyncClient(timeout=1.0) as client:
        while not stop.is_set():
            try:
                r = await client.get(f"http://127.0.0.1:{port}/healthz")
                if r.status_code == 200:
                    answered += 1
                else:
                    misses.append(f"status {r.status_code}")
            except httpx.HTTPError as exc:
                misses.append(f"{type(exc).__name__} at {time.strftime('%X')}")
            await asyncio.sleep(0.2)
    return answered


async def test_degenerate_answers_are_graded_while_the_worker_answers_its_health_probe(
    stack: Settings, pg: asyncpg.Connection, spawn: Any, tmp_path: Path
) -> None:
    group = unique("degenerate")
    await ensure_topics(admin_settings(), [group])
    proc, port = spawn(
        "evalstream.worker",
        WORKER_GROUP=group,
        WORKER_MODEL="replay:*",
        **replay_env(),
        GRADING_TIMEOUT_S=str(GRADING_TIMEOUT_S),
        GRADING_PROCESSES="2",
    )
    await asyncio.to_thread(proc.wait_healthy, port)

    # one run per grader (auto covers exact, numeric and choice by each item's shape); every
    # degenerate answer once per grader, plus one right answer per grader, so that a grader
    # that fails everything would not pass
    shapes: dict[str, list[tuple[dict[str, Any], str]]] = {
        "auto": [
            ({"answer": "Paris"}, "Paris"),
            ({"answer": "42"}, "42"),
            ({"answer": "B", "choices": ["red", "green", "blue"]}, "B"),
        ],
        "contains": [({"answer": "the capital"}, "It is the capital.")],
        "json:value": [({"answer": "1"}, '{"value": 1}')],
        "regex": [({"answer": "Paris"}, "Paris, of course")],
    }
    answers: list[dict[str, str]] = []
    runs: dict[str, str] = {}
    expected: dict[str, dict[str, str]] = {}  # run grader -> item id -> "wrong" / "right" / "timeout"
    for grader, items in shapes.items():
        tag = grader.split(":")[0]
        rows, expected[grader] = [], {}
        for k, (fields, right) in enumerate(items):
            for name, text in [("right", right), *DEGENERATE.items()]:
                item_id = f"{tag}-{k}-{name}"
                rows.append({"id": item_id, "question": "?", **fields})
                answers.append({"id": item_id, "response": text})
                expected[grader][item_id] = "right" if name == "right" else "wrong"
        if grader == "regex":  # a pattern of the dataset's own that never ends in Python's engine
            rows.append({"id": "regex-bomb", "question": "?", "answer": "a", "meta": {"regex": BOMB_PATTERN}})
            answers.append({"id": "regex-bomb", "response": "a" * 60 + "!"})
            expected[grader]["regex-bomb"] = "timeout"
        write_jsonl(tmp_path / f"{tag}.jsonl", rows)
    replay = write_jsonl(replay_dir() / "answers.jsonl", answers)

    stop, misses = asyncio.Event(), list[str]()
    prober = asyncio.create_task(_poll_health(port, stop, misses))
    try:
        for grader in shapes:
            tag = grader.split(":")[0]
            out = await asyncio.to_thread(
                evalctl,
                *("submit", str(tmp_path / f"{tag}.jsonl"), "--model", f"replay:{replay}"),
                *("--grader", grader, "--worker-group", group, "--shard-size", "8"),
            )
            runs[grader] = _run_id(out.stdout)
        statuses = {g: await _final_status(pg, r) for g, r in runs.items()}
    finally:
        stop.set()
        answered = await prober
    assert statuses == dict.fromkeys(shapes, "completed")
    assert misses == [], f"/healthz missed {len(misses)} of {answered + len(misses)} probes: {misses[:5]}"
    assert answered >= 10

    for grader, run_id in runs.items():
        rows = await pg.fetch("SELECT item_id, correct, error FROM item_results WHERE run_id = $1", run_id)
        got = {}
        for r in rows:
            if r["error"] is None:
                got[r["item_id"]] = "right" if r["correct"] else "wrong"
            elif r["error"].startswith(f"GradingTimeout: grader regex took over {GRADING_TIMEOUT_S:g} s"):
                got[r["item_id"]] = "timeout"
            else:
                got[r["item_id"]] = r["error"]
        assert got == expected[grader], grader


async def test_a_shard_that_always_fails_is_dead_lettered_after_its_deliveries(
    stack: Settings, pg: asyncpg.Connection, spawn: Any, tmp_path: Path
) -> None:
    group, poison = unique("poison"), unique("poison-item")
    await ensure_topics(admin_settings(), [group])
    proc, port = spawn(
        "evalstream.worker",
        WORKER_GROUP=group,
        WORKER_MODEL="null",
        WORKER_MAX_DELIVERIES="2",
        FAULT_INJECT=f"worker_fail_item={poison}",
    )
    await asyncio.to_thread(proc.wait_healthy, port)
    items = arithmetic_items(10, prefix=unique("p") + "-")
    items[7]["id"] = poison  # in the second shard of five
    dataset = write_jsonl(tmp_path / "poison.jsonl", items)
    out = evalctl("submit", str(dataset), "--model", "null", "--worker-group", group, "--shard-size", "5")
    run_id = _run_id(out.stdout)
    assert await _final_status(pg, run_id) == "completed"

    rows = await pg.fetch("SELECT item_id, error, response FROM item_results WHERE run_id = $1", run_id)
    assert len(rows) == 10
    failed = sorted(r["item_id"] for r in rows if r["error"] is not None)
    assert failed == sorted(i["id"] for i in items[5:])  # the poison shard's items, and only those
    error = next(r["error"] for r in rows if r["error"] is not None)
    assert error.startswith("delivered 2 times without completing")
    assert "RuntimeError: injected fault" in error
    letters = await pg.fetch(
        "SELECT original_topic, headers FROM dead_letters WHERE run_id = $1 AND original_topic = $2",
        run_id,
        topics.work_topic(group),
    )
    assert len(letters) == 1
    headers = json.loads(letters[0]["headers"])
    assert headers["x-attempts"] == "2" and headers["x-error-type"] == "DeliveriesExceeded"
    # the worker goes on serving: a later run on the same group completes
    out = evalctl("submit", str(write_jsonl(tmp_path / "ok.jsonl", arithmetic_items(4, prefix=unique("ok")))),
                  "--model", "null", "--worker-group", group)  # fmt: skip
    assert await _final_status(pg, _run_id(out.stdout)) == "completed"


async def test_hostile_jobs_are_rejected_with_a_clear_message_and_publish_nothing(
    stack: Settings, pg: asyncpg.Connection, kafka_producer: AIOKafkaProducer, tmp_path: Path
) -> None:
    good = upload_dataset(
        stack, write_jsonl(tmp_path / "good.jsonl", arithmetic_items(3, prefix=unique("h")))
    )
    cases = {
        "/dev/zero": ("dataset", "this producer reads no local files"),
        "/etc/passwd": ("dataset", "this producer reads no local files"),
        "/tmp/../etc/shadow": ("dataset", "this producer reads no local files"),
        f"s3://{stack.s3_bucket_results}/runs/x/manifest.json": (
            "dataset",
            f"datasets are read from the bucket {stack.s3_bucket_datasets!r} only",
        ),
    }
    jobs = {
        unique("run-hostile"): (JobSpec(dataset=d, model="null"), expected) for d, expected in cases.items()
    }
    jobs[unique("run-huge")] = (
        JobSpec(dataset=good, model="null", system_prompt="x" * 200_000),  # rides in every shard
        ("job", "over the 65536-byte limit"),
    )
    shards_before = await topic_end_offsets(topics.SHARDS)
    for run_id, (job, _) in jobs.items():
        job = msgspec.structs.replace(job, run_id=run_id)
        await kafka_producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())
    bad_id = "../../" + unique("escape")
    await kafka_producer.send_and_wait(
        topics.JOBS, encode(JobSpec(dataset=good, model="null", run_id=bad_id)), key=b"bad-id"
    )

    for run_id, (_, (field, message)) in jobs.items():
        assert await _final_status(pg, run_id) == "rejected"
        problems = json.loads(await pg.fetchval("SELECT problems FROM runs WHERE run_id = $1", run_id))
        assert [p["field"] for p in problems] == [field], problems
        assert message in problems[0]["message"], problems

    async def bad_id_rejected() -> bool:  # recorded under an id derived from the message
        return bool(
            await pg.fetchval(
                "SELECT count(*) FROM runs WHERE status = 'rejected' AND position($1 in problems::text) > 0",
                f"run_id {bad_id!r} must be 1-128 characters",
            )
        )

    await wait_until(bad_id_rejected, 60, what="the job with a bad run_id to be rejected")
    assert await pg.fetchval("SELECT count(*) FROM runs WHERE run_id = $1", bad_id) == 0
    shards = await read_topic_since(topics.SHARDS, shards_before)
    ours = [v for _, v, _ in shards if any(r.encode() in v for r in [*jobs, bad_id])]
    assert ours == []
    # the normal path still works: evalctl uploads to the datasets bucket
    out = evalctl("submit", str(tmp_path / "good.jsonl"), "--model", "null")
    assert await _final_status(pg, _run_id(out.stdout)) == "completed"
