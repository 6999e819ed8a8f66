"""`evalctl regrade`: a finished run's stored answers graded again, as a new run, with no
model call (evalctl runs with Kafka unreachable to prove it) and the original untouched."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from evalstream.common import storage
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import EVALCTL, ROOT, result_rows, submit_wait, write_jsonl
from tests.fakes.openai_provider import FakeProvider
from tests.support import free_port, unique

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
    # no Kafka: whatever a regrade does, it cannot publish work for a model
    env = {**os.environ, "KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}", "PYTHONUNBUFFERED": "1"}
    env["WORKER_MODEL"] = "openai:*"  # the judges it may call, as a worker's operator allows them
    proc = subprocess.run(
        [*EVALCTL, "regrade", run_id, "--grader", grader, "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture
async def original(stack: Settings, pg: asyncpg.Connection, spawn: Any, tmp_path: Path) -> dict[str, Any]:
    """A completed run graded with `exact`, on a replay worker group of its own."""
    group = unique("regrade")
    await ensure_topics(stack.kafka_bootstrap, [group])
    worker, port = spawn("evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="replay:*")
    await asyncio.to_thread(worker.wait_healthy, port)
    tag = unique("g")
    items = [
        {"id": f"{tag}-{i}", "question": f"Question {i}?", "answer": g} for i, (g, _) in enumerate(ANSWERS)
    ]
    replies = [{"id": f"{tag}-{i}", "response": r} for i, (_, r) in enumerate(ANSWERS)]
    dataset, answers = write_jsonl(tmp_path / "q.jsonl", items), write_jsonl(tmp_path / "a.jsonl", replies)
    summary = await asyncio.to_thread(
        submit_wait, dataset, "--model", f"replay:{answers}", "--grader", "exact", "--worker-group", group
    )
    rows = await result_rows(pg, summary["run_id"])
    assert [r["correct"] for r in rows] == EXACT
    return summary


async def test_regrade_makes_a_new_run_and_keeps_the_original(
    stack: Settings, pg: asyncpg.Connection, original: dict[str, Any]
) -> None:
    run_id = original["run_id"]
    before = [dict(r) for r in await result_rows(pg, run_id)]
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
