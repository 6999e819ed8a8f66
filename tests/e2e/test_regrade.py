"""`evalctl regrade`: a finished run's stored answers graded again, as a new run, with no
model call (the grading worker's engine counts none) and the original untouched. evalctl
asks (a Regrade on eval.control); the aggregator makes the run, a worker grades; a
redelivered request adds nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from evalstream.common import spread, storage, topics
from evalstream.common.lag import group_lag
from evalstream.common.messages import Regrade, encode
from evalstream.common.settings import SERVICE_PORTS, Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import EVALCTL, ROOT, result_rows, submit_wait, write_jsonl
from tests.fakes.openai_provider import FakeProvider
from tests.replay_files import replay_dir, replay_env
from tests.support import admin_settings, read_topic_since, topic_end_offsets, unique, wait_until

pytestmark = pytest.mark.stack

# (gold, response): exact and contains disagree on some of them
ANSWERS = [
    ("New York", "New York"),
    ("New York", "It is New York City, the largest."),
    ("George Washington", "The first president was George Washington."),
    ("Paris", "Lyon"),
    ("Mount Everest", "K2, not Mount Everest"),
    ("blue whale", "The answer: Blue Whale!"),
]
EXACT = [True, False, False, False, False, True]
CONTAINS = [True, True, True, False, True, True]


def regrade(run_id: str, grader: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [*EVALCTL, "regrade", run_id, "--grader", grader, "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def samples(port: int, name: str) -> dict[str, float]:
    """The service's `name` series (label values joined) from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def engine_requests(port: int) -> float:
    return sum(samples(port, "evalstream_engine_requests_total").values())


def graded_items(port: int) -> float:
    return samples(port, "evalstream_items_total").get("service=worker,status=succeeded", 0.0)


@pytest.fixture
async def original(stack: Settings, pg: asyncpg.Connection, spawn: Any, tmp_path: Path) -> dict[str, Any]:
    """A completed run graded with `exact`, on a replay worker group of its own, which also
    grades its regrades (its operator allows judges of any OpenAI-compatible endpoint)."""
    group = unique("regrade")
    await ensure_topics(admin_settings(), [group])
    worker, port = spawn(
        "evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="replay:*,openai:*", **replay_env()
    )
    await asyncio.to_thread(worker.wait_healthy, port)
    tag = unique("g")
    items = [
        {"id": f"{tag}-{i}", "question": f"Question {i}?", "answer": g} for i, (g, _) in enumerate(ANSWERS)
    ]
    replies = [{"id": f"{tag}-{i}", "response": r} for i, (_, r) in enumerate(ANSWERS)]
    dataset, answers = (
        write_jsonl(tmp_path / "q.jsonl", items),
        write_jsonl(replay_dir() / "a.jsonl", replies),
    )
    summary = await asyncio.to_thread(
        submit_wait, dataset, "--model", f"replay:{answers}", "--grader", "exact", "--worker-group", group
    )
    rows = await result_rows(pg, summary["run_id"])
    assert [r["correct"] for r in rows] == EXACT
    return {**summary, "worker_port": port}


async def test_regrade_makes_a_new_run_and_keeps_the_original(
    stack: Settings, pg: asyncpg.Connection, original: dict[str, Any]
) -> None:
    run_id = original["run_id"]
    before = [dict(r) for r in await result_rows(pg, run_id)]
    calls_before = engine_requests(original["worker_port"])
    graded_before = graded_items(original["worker_port"])
    proc = await asyncio.to_thread(regrade, run_id, "contains")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    new_id = summary["run_id"]
    assert new_id != run_id and summary["regrade_of"] == run_id
    assert summary["changed"] == 3 and summary["grading_failures"] == 0
    assert (summary["status"], summary["grader"], summary["total"]) == ("completed", "contains", len(ANSWERS))
    assert summary["accuracy"] == pytest.approx(sum(CONTAINS) / len(ANSWERS))
    after = [dict(r) for r in await result_rows(pg, run_id)]
    assert after == before, "the original run changed"
    regraded = await result_rows(pg, new_id)
    assert [r["correct"] for r in regraded] == CONTAINS
    for old, new in zip(before, regraded, strict=True):  # only the grade is new
        same = ("item_id", "response", "latency_ms", "cache_hit", "served_by", "attempts", "prompt_tokens")
        assert [old[k] for k in same] == [new[k] for k in same]
    run = await pg.fetchrow("SELECT manifest, manifest_sha256, spec FROM runs WHERE run_id = $1", new_id)
    manifest = json.loads(run["manifest"])
    assert manifest["regrade_of"]["run_id"] == run_id and manifest["regrade_of"]["grader"] == "exact"
    assert manifest["grader"]["name"] == "contains" and manifest["grader"]["version"] == "contains/1 clean/1"
    assert run["manifest_sha256"] != original["manifest_sha256"]
    report = storage.get_bytes(storage.client(stack), stack.s3_bucket_results, f"runs/{new_id}/report.json")
    assert json.loads(report)["accuracy"] == summary["accuracy"]
    # graded by the worker, without a model call
    assert engine_requests(original["worker_port"]) == calls_before
    assert graded_items(original["worker_port"]) == graded_before + len(ANSWERS)


async def test_regrade_with_a_model_judge(pg: asyncpg.Connection, original: dict[str, Any]) -> None:
    def verdict(messages: list[dict[str, Any]]) -> str:
        prompt = messages[-1]["content"]
        reference = prompt.split("Reference answer:\n", 1)[1].split("\n\n", 1)[0]
        response = prompt.split("Response to grade:\n", 1)[1].split("\n\n", 1)[0]
        ok = reference.lower() in response.lower() and "not" not in response
        return f"Compared.\nVERDICT: {'CORRECT' if ok else 'INCORRECT'}"

    with FakeProvider(answer=verdict) as judge:
        proc = await asyncio.to_thread(regrade, original["run_id"], f"judge:{judge.spec('judge-model')}")
        calls = judge.count(200)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = await result_rows(pg, summary["run_id"])
    assert calls == len(ANSWERS)
    assert [r["correct"] for r in rows] == [True, True, True, False, False, True]
    assert {r["extracted"] for r in rows} == {"CORRECT", "INCORRECT"}


async def test_regrade_refuses_bad_graders_before_writing(
    pg: asyncpg.Connection, original: dict[str, Any]
) -> None:
    runs_before = await pg.fetchval(
        "SELECT count(*) FROM runs WHERE spec->>'regrade_of' = $1", original["run_id"]
    )
    unknown = await asyncio.to_thread(regrade, original["run_id"], "fuzzy", False)
    assert unknown.returncode == 2 and "unknown grader 'fuzzy'" in unknown.stderr
    not_numbers = await asyncio.to_thread(regrade, original["run_id"], "numeric", False)
    assert not_numbers.returncode == 2 and "is not a number" in not_numbers.stderr
    missing = await asyncio.to_thread(regrade, "run-does-not-exist", "exact", False)
    assert missing.returncode != 0 and "no run" in missing.stderr
    runs_after = await pg.fetchval(
        "SELECT count(*) FROM runs WHERE spec->>'regrade_of' = $1", original["run_id"]
    )
    assert runs_after == runs_before


async def control_consumed(stack: Settings) -> bool:
    lag = await group_lag(admin_settings(), topics.AGGREGATOR_CONTROL_GROUP, topics.CONTROL)
    return bool(lag) and all(n == 0 for n in lag.values())


def run_items(run_id: str) -> dict[str, float]:
    aggregator_port = SERVICE_PORTS["aggregator"] + int(os.environ.get("EVALSTREAM_PORT_OFFSET", "0"))
    return {
        k: v
        for k, v in samples(aggregator_port, "evalstream_run_items_total").items()
        if f"run_id={run_id}," in k
    }


async def test_a_redelivered_regrade_request_adds_nothing(
    stack: Settings,
    pg: asyncpg.Connection,
    pg_admin: asyncpg.Connection,
    kafka_producer: AIOKafkaProducer,
    original: dict[str, Any],
) -> None:
    """The same request again - after the run completed, and after a crash that left it
    `publishing` (its shards published again) - neither grades again nor counts again."""
    port = original["worker_port"]
    proc = await asyncio.to_thread(regrade, original["run_id"], "contains")
    new_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    graded = graded_items(port)
    counted = run_items(new_id)
    assert sum(counted.values()) == len(ANSWERS)
    request = Regrade(run_id=original["run_id"], new_run_id=new_id, grader="contains")

    async def redeliver() -> int:
        """Publishes the request twice; the number of shards of the run published since."""
        start = await topic_end_offsets(topics.SHARDS)
        for _ in range(2):
            await kafka_producer.send_and_wait(topics.CONTROL, encode(request), key=new_id.encode())
        await wait_until(lambda: control_consumed(stack), 60, what="the aggregator to read the requests")
        published = await read_topic_since(topics.SHARDS, start)
        return sum(spread.run_of_key(key) == new_id for key, _, _ in published)

    assert await redeliver() == 0  # the run is completed: nothing to do
    assert graded_items(port) == graded

    # as if the aggregator had died while publishing: the request is acted on again
    await pg_admin.execute("UPDATE runs SET status = 'publishing' WHERE run_id = $1", new_id)
    assert await redeliver() == 1  # the run's one shard, published once more (not twice)

    async def regraded_again() -> bool:
        status = await pg.fetchval("SELECT status FROM runs WHERE run_id = $1", new_id)
        return status == "completed" and graded_items(port) == graded + len(ANSWERS)

    await wait_until(regraded_again, 120, what="the republished shards graded and the run completed")
    row = await pg.fetchrow("SELECT total, recorded FROM runs WHERE run_id = $1", new_id)
    assert (row["total"], row["recorded"]) == (len(ANSWERS), len(ANSWERS))
    assert await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", new_id) == len(ANSWERS)
    assert run_items(new_id) == counted  # the aggregator counted no row twice
    assert [r["correct"] for r in await result_rows(pg, new_id)] == CONTAINS
    regrades = await pg.fetchval(
        "SELECT count(*) FROM runs WHERE spec->>'regrade_of' = $1", original["run_id"]
    )
    assert regrades == 1
