"""Issue 3 end to end on the real stack: every item ends with exactly one result."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common import topics
from evalstream.common.messages import GenerationParams, JobSpec, RetryPolicy, Shard, decode, encode
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from evalstream.worker.engines.testhooks import FaultPlan
from tests.e2e.helpers import (
    ROOT,
    arithmetic_items,
    evalctl,
    result_rows,
    results_jsonl,
    run_status,
    submit_wait,
    write_jsonl,
)
from tests.replay_files import replay_dir
from tests.support import (
    STACK,
    admin_settings,
    read_topic_since,
    topic_end_offsets,
    unique,
    upload_dataset,
    wait_until,
)

pytestmark = pytest.mark.stack


async def test_null_run_has_exactly_one_row_per_item(pg: asyncpg.Connection, tmp_path: Path) -> None:
    items = arithmetic_items(300)
    summary = submit_wait(
        write_jsonl(tmp_path / "arith.jsonl", items), "--model", "null", "--shard-size", "25"
    )
    assert summary["status"] == "completed"
    rows = await result_rows(pg, summary["run_id"])
    assert sorted(r["item_id"] for r in rows) == sorted(i["id"] for i in items)
    assert summary["total"] == summary["recorded"] == 300
    assert all(r["served_by"].endswith("/null") for r in rows)


async def test_accuracy_in_report_equals_recomputation_from_results(tmp_path: Path) -> None:
    # replay answers: half right, a few in words the numeric grader must still read
    items = arithmetic_items(40)
    answers = [
        {"id": it["id"], "response": f"The answer is {it['answer'] if i % 2 == 0 else 'unknown'}."}
        for i, it in enumerate(items)
    ]
    replay = write_jsonl(replay_dir() / "answers.jsonl", answers)
    summary = submit_wait(write_jsonl(tmp_path / "arith.jsonl", items), "--model", f"replay:{replay}")
    records = results_jsonl(summary["run_id"])
    assert len(records) == 40 and len({r["item_id"] for r in records}) == 40
    assert sum(r["score"] for r in records) / len(records) == pytest.approx(summary["accuracy"])
    assert summary["accuracy"] == pytest.approx(0.5)
    report = json.loads(evalctl("report", summary["run_id"], "--json").stdout.splitlines()[-1])
    assert report["accuracy"] == summary["accuracy"] and report["succeeded"] == 40


async def test_rejected_dataset_publishes_nothing(
    stack: Settings,
    pg: asyncpg.Connection,
    pg_admin: asyncpg.Connection,
    tmp_path: Path,
    kafka_producer: AIOKafkaProducer,
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "question": "1+1?", "answer": "2"}\n{"id": "b", "question": "2+2?"\n'
        '{"id": "a", "question": "3+3?", "answer": "6"}\n'
    )
    watched = [topics.SHARDS, topics.RESULTS, topics.work_topic(stack.worker_group)]
    before = {t: await topic_end_offsets(t) for t in watched}
    # 1) through evalctl: refused locally, naming the lines, exit code 2
    proc = evalctl("submit", str(bad), check=False)
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "line 3" in proc.stderr and "duplicate" in proc.stderr.lower()
    # 2) straight to eval.jobs by another Kafka client: the producer rejects the whole run
    run_id = unique("run-rejected")
    job = JobSpec(dataset=upload_dataset(stack, bad), model="null", run_id=run_id)
    await kafka_producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())
    # 3) garbage on eval.jobs does not stop the producer: a later good job still runs
    await kafka_producer.send_and_wait(topics.JOBS, b"\x00not json{", key=b"garbage")

    async def decided() -> bool:
        return await run_status(pg, run_id) not in (None, "validating")

    await wait_until(decided, 60, what="the producer to decide on the job")
    assert await run_status(pg, run_id) == "rejected"
    problems = json.loads(await pg.fetchval("SELECT problems FROM runs WHERE run_id = $1", run_id))
    assert {p["line"] for p in problems if p["line"]} >= {2, 3}
    # the producer is done with the job (and the garbage) once its group has no lag left:
    # only then can "nothing was published" be read
    await wait_until(
        lambda: _no_lag(stack, topics.PRODUCER_GROUP, topics.JOBS),
        60,
        what="the producer to consume the jobs",
    )
    after = {t: await topic_end_offsets(t) for t in watched}
    new_shards = await read_topic_since(topics.SHARDS, before[topics.SHARDS])
    assert not [v for _, v, _ in new_shards if run_id.encode() in v]
    assert after[topics.SHARDS] == before[topics.SHARDS] or new_shards  # nothing of ours, whatever else ran
    assert await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id) == 0
    good = submit_wait(write_jsonl(tmp_path / "ok.jsonl", arithmetic_items(5)), "--model", "null")
    assert good["status"] == "completed"
    dead = await pg_admin.fetchval(  # a dead letter's payload: not the users' to read
        "SELECT count(*) FROM dead_letters WHERE original_topic = $1 AND payload = $2",
        topics.JOBS,
        b"\x00not json{",
    )
    assert dead >= 1


async def test_duplicate_shard_and_aggregator_kill_leave_one_row_per_item(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path, kafka_producer: AIOKafkaProducer
) -> None:
    start = await topic_end_offsets(topics.SHARDS)
    # Results of more bytes than one results window takes (aggregator_window_bytes, 4 MiB;
    # ~560 bytes a result here), so that the run is recorded over several windows however
    # far the aggregator lags, and a kill between two of them lands part-way.
    items = arithmetic_items(12_000, prefix="k")
    total, shard_size = len(items), 100
    name = unique("aggregator-kill")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evalstream.cli",
            "submit",
            str(write_jsonl(tmp_path / "big.jsonl", items)),
            "--model",
            "null",
            "--shard-size",
            str(shard_size),
            "--wait",
            "--json",
            "--timeout",
            "300",
            "--name",
            name,
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )

    async def part_way() -> str | None:  # the run, once its results flow and before they end
        row = await pg.fetchrow("SELECT run_id, recorded FROM runs WHERE name = $1", name)
        return row["run_id"] if row is not None and 0 < row["recorded"] < total else None

    # kill -9 the aggregator while results flow, then let `make up` bring it back
    run_id = await wait_until(part_way, 120, interval=0.02, what="the run's first results")
    pid = int((STACK / "run" / "aggregator.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    recorded_at_kill = await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id)
    assert recorded_at_kill < total, "the kill landed after the run had ended"

    async def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await wait_until(gone, 30, what="the killed aggregator to be gone")
    subprocess.run([sys.executable, "ops/local/stack.py", "up"], cwd=ROOT, check=True, capture_output=True)
    out, _ = proc.communicate(timeout=400)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["run_id"] == run_id
    # publish one of its shards again, as a producer retry would
    shards = [(k, v) for k, v, _ in await read_topic_since(topics.SHARDS, start) if run_id.encode() in v]
    assert len(shards) == total // shard_size
    results_before = await topic_end_offsets(topics.RESULTS)
    await kafka_producer.send_and_wait(topics.SHARDS, shards[7][1], key=shards[7][0])

    async def reprocessed() -> bool:
        new = await read_topic_since(topics.RESULTS, results_before)
        return any(decode(shards[7][1], Shard).shard_id.encode() in v for _, v, _ in new)

    await wait_until(reprocessed, 60, what="the duplicate shard to be processed again")
    # the aggregator has consumed (and committed after writing) every result there is
    await wait_until(
        lambda: _no_lag(stack, topics.AGGREGATOR_GROUP, topics.RESULTS), 60, what="the aggregator to catch up"
    )
    rows = await result_rows(pg, run_id)
    assert len(rows) == total and len({r["item_id"] for r in rows}) == total
    assert await run_status(pg, run_id) == "completed"
    # the count completion is decided on moved once per item, not once per delivery
    assert await pg.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) == total


async def _no_lag(stack: Settings, group: str, topic: str) -> bool:
    from evalstream.common.lag import group_lag

    return sum((await group_lag(admin_settings(), group, topic)).values()) == 0


@pytest.fixture
def chaos_group(stack: Settings, spawn):
    """A worker group of its own whose null engine fails some items on purpose."""
    group = unique("chaos")
    asyncio.run(ensure_topics(admin_settings(), [group]))
    faults = "transient=0.3,permanent=0.1,seed=11"
    proc, port = spawn(
        "evalstream.worker",
        WORKER_GROUP=group,
        WORKER_MODEL="null",
        ENGINE_FAULTS=faults,
        WORKER_ID=f"{group}-0",
    )
    proc.wait_healthy(port)
    return group, faults, proc


async def test_transient_failures_retry_and_permanent_ones_dead_letter(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path, kafka_producer: AIOKafkaProducer, chaos_group
) -> None:
    group, faults, _ = chaos_group
    items = arithmetic_items(200, prefix="c")
    dataset = write_jsonl(tmp_path / "chaos.jsonl", items)
    run_id = unique("run-chaos")
    delay = 6.0
    retry = RetryPolicy(max_attempts=3, base_delay_s=delay, multiplier=1.0)
    job = JobSpec(
        dataset=upload_dataset(stack, dataset),
        model="null",
        run_id=run_id,
        worker_group=group,
        retry=retry,
        shard_size=10,
        generation=GenerationParams(max_tokens=8),
    )
    await kafka_producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())

    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, 120, what="the chaos run to complete")
    plan = FaultPlan.parse(faults).planned_failure
    expected_failed, expected_attempts = set(), {}
    for it in items:
        for attempt in range(1, 4):
            failure = plan(it["id"], attempt)
            if failure is None:
                expected_attempts[it["id"]] = attempt
                break
            if failure == "permanent" or attempt == 3:
                expected_failed.add(it["id"])
                break
    rows = {r["item_id"]: r for r in await result_rows(pg, run_id)}
    assert len(rows) == 200
    assert {i for i, r in rows.items() if r["error"]} == expected_failed
    assert {i: r["attempts"] for i, r in rows.items() if not r["error"]} == expected_attempts
    assert 5 <= len(expected_failed) <= 60 and any(a > 1 for a in expected_attempts.values())
    # Retries never blocked the partition (every shard of a run shares one): all first
    # attempts were recorded before any retry was even due, and no retry came early.
    first = [r["recorded_at"].timestamp() for r in rows.values() if not r["error"] and r["attempts"] == 1]
    retried = [r["recorded_at"].timestamp() for r in rows.values() if not r["error"] and r["attempts"] > 1]
    assert max(first) - min(first) < delay and max(first) < min(retried)
    dead = await pg.fetch("SELECT item_id, error FROM dead_letters WHERE run_id = $1", run_id)
    assert {d["item_id"] for d in dead} == expected_failed
    report = json.loads(evalctl("report", run_id, "--json").stdout.splitlines()[-1])
    assert report["failed"] == len(expected_failed) and report["status"] == "completed"

    # Redrive twice: the failures are tried again, still exactly one row per item.
    for _ in range(2):
        before = await pg.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", run_id)
        evalctl("dlq", "redrive", run_id)

        async def redriven(before: int = before) -> bool:
            n = await pg.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", run_id)
            return n >= before + len(expected_failed)

        await wait_until(redriven, 90, what="the redriven items to fail again")
    rows_after = await result_rows(pg, run_id)
    assert len(rows_after) == 200
    assert {r["item_id"] for r in rows_after if r["error"]} == expected_failed


async def test_success_after_redrive_replaces_recorded_failure(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path, kafka_producer: AIOKafkaProducer, spawn
) -> None:
    group = unique("flaky")
    await ensure_topics(admin_settings(), [group])
    faults = "transient=0,permanent=0.2,seed=5"
    proc, port = spawn("evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="null", ENGINE_FAULTS=faults)
    await asyncio.to_thread(proc.wait_healthy, port)
    items = arithmetic_items(50, prefix="f")
    run_id = unique("run-redrive")
    job = JobSpec(
        dataset=upload_dataset(stack, write_jsonl(tmp_path / "f.jsonl", items)),
        model="null",
        run_id=run_id,
        worker_group=group,
        shard_size=10,
    )
    await kafka_producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())

    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, 90, what="the run to complete")
    failed = {r["item_id"] for r in await result_rows(pg, run_id) if r["error"]}
    assert failed
    # the "fix": the group comes back without faults, then the dead letters are redriven
    proc.stop()
    healthy, port2 = spawn("evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="null")
    await asyncio.to_thread(healthy.wait_healthy, port2)
    evalctl("dlq", "redrive", run_id)

    async def all_succeeded() -> bool:
        return (
            await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1 AND error IS NULL", run_id)
            == 50
        )

    await wait_until(all_succeeded, 90, what="the redriven items to succeed")
    assert await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id) == 50
    summary = json.loads(evalctl("report", run_id, "--json").stdout.splitlines()[-1])
    assert summary["failed"] == 0 and summary["succeeded"] == 50


def test_parquet_in_s3_mirrors_the_database(stack: Settings, tmp_path: Path) -> None:
    import io

    import pyarrow.parquet as pq

    from evalstream.common import storage

    summary = submit_wait(
        write_jsonl(tmp_path / "p.jsonl", arithmetic_items(60, prefix="p")),
        "--model",
        "null",
        "--shard-size",
        "16",
    )
    s3 = storage.client(stack)
    names = sorted(
        o.object_name
        for o in s3.list_objects(stack.s3_bucket_results, prefix=f"runs/{summary['run_id']}/", recursive=True)
    )
    # the run's rows in segments by the order they were recorded (60 rows: one segment),
    # whatever its shards were (4 here)
    parquet = [n for n in names if n.endswith(".parquet")]
    assert parquet == [f"runs/{summary['run_id']}/results/part-000000.parquet"]
    assert f"runs/{summary['run_id']}/report.json" in names
    ids = []
    for n in parquet:
        ids += (
            pq.read_table(io.BytesIO(storage.get_bytes(s3, stack.s3_bucket_results, n)))
            .column("item_id")
            .to_pylist()
        )
    assert sorted(ids) == sorted(f"p{i:05d}" for i in range(60))
    report = json.loads(
        storage.get_bytes(s3, stack.s3_bucket_results, f"runs/{summary['run_id']}/report.json")
    )
    assert report["total"] == 60 and report["status"] == "completed"
