"""Fault scenarios (issue 6): break one thing mid-run, then check that every item has
exactly one result. `make test-faults` runs them all on a stack of their own (ports
shifted, so that killing its broker or database disturbs nobody); `make test` runs the
ones marked `fast` on the development stack.

Each scenario pins its run to a worker group of its own, served by workers the test
starts (null engine slowed by ENGINE_DELAY_MS so that faults land mid-run).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common import topics
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from evalstream.worker.engines.testhooks import FaultPlan
from tests.faults.harness import (
    check_invariant,
    count_rows,
    items,
    kill,
    record,
    stack_cmd,
    submit,
    summary,
    time_to_progress,
    wait_completed,
    wait_rows,
    write_dataset,
)
from tests.support import ServiceProcess, unique, wait_until

pytestmark = [pytest.mark.stack, pytest.mark.faults]


class Group:
    """A worker group of the test's own: its workers can be killed, paused and scaled."""

    def __init__(self, settings: Settings, spawn, delay_ms: int, **env: str) -> None:
        self.name = unique("fg")
        self.spawn = spawn
        self.env = {
            "WORKER_GROUP": self.name,
            "WORKER_MODEL": "null",
            "ENGINE_DELAY_MS": str(delay_ms),
            "WORKER_MAX_SHARDS": "4",
            **env,
        }
        self.workers: list[ServiceProcess] = []

    async def start(self, settings: Settings, n: int = 1, **env: str) -> None:
        await ensure_topics(settings.kafka_bootstrap, [self.name])
        for _ in range(n):
            proc, port = self.spawn("evalstream.worker", **{**self.env, **env})
            await asyncio.to_thread(proc.wait_healthy, port)
            self.workers.append(proc)


@pytest.fixture(autouse=True)
def healthy_stack(stack: Settings) -> None:
    """Every scenario starts from a whole stack, whatever the one before it broke."""
    stack_cmd("up")


@pytest.fixture
def group(stack: Settings, spawn) -> Group:
    return Group(stack, spawn, delay_ms=10)


async def start_run(
    stack: Settings, tmp_path: Path, group: Group, n: int, prefix: str, **kw: object
) -> tuple[str, set[str]]:
    rows = items(n, prefix)
    run_id = unique(f"run-{prefix}")
    await submit(stack, write_dataset(tmp_path / f"{prefix}.jsonl", rows), run_id, group=group.name, **kw)  # type: ignore[arg-type]
    return run_id, {r["id"] for r in rows}


async def finish(
    stack: Settings,
    scenario: str,
    run_id: str,
    ids: set[str],
    t0: float,
    recover_s: float | None,
    timeout: float = 240,
    **extra: object,
) -> None:
    await wait_completed(stack, run_id, timeout)
    inv = await check_invariant(stack, run_id, ids)
    record(scenario, inv, recover_s, time.monotonic() - t0, **extra)
    assert inv.holds, summary(inv)


# --------------------------------------------------------------------------- workers


@pytest.mark.fast
async def test_01_kill_9_worker_mid_batch(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 1500, "k9w")
    await wait_rows(stack, run_id, 200, 60)
    group.workers[0].signal(signal.SIGKILL)
    await group.start(stack)  # a replacement, as a supervisor would start
    recover = await time_to_progress(stack, run_id, 90)
    await finish(stack, "01 kill -9 worker mid-batch", run_id, ids, t0, recover)


async def test_02_sigstop_worker_past_session_timeout(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack, 2)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 3000, "stop")
    await wait_rows(stack, run_id, 300, 60)
    paused = group.workers[1]
    paused.signal(signal.SIGSTOP)
    t_pause = time.monotonic()
    await asyncio.sleep(25)  # > session_timeout_ms (15 s): the group evicts it and rebalances
    paused.signal(signal.SIGCONT)  # its late commit must fail, not lose or duplicate
    await finish(
        stack,
        "02 SIGSTOP worker > session timeout, SIGCONT",
        run_id,
        ids,
        t0,
        None,
        paused_s=round(time.monotonic() - t_pause, 1),
    )


async def test_03_batch_longer_than_poll_interval(stack: Settings, spawn, tmp_path: Path) -> None:
    # One shard per batch, 50 items x 200 ms = 10 s per batch, against a 4 s poll interval.
    slow = Group(stack, spawn, delay_ms=200, WORKER_MAX_SHARDS="1", WORKER_MAX_POLL_INTERVAL_MS="4000")
    await slow.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, slow, 150, "poll", shard_size=50)
    await finish(stack, "03 batch longer than the poll interval", run_id, ids, t0, None, timeout=180)


# --------------------------------------------------------------------------- infrastructure


@pytest.mark.parametrize("how", ["clean", "kill -9"])
async def test_04_restart_kafka_mid_run(stack: Settings, group: Group, tmp_path: Path, how: str) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 2000, "kafka" + how[:4].strip())
    await wait_rows(stack, run_id, 300, 60)
    if how == "clean":
        stack_cmd("stop", "kafka")
    else:
        kill("kafka")
        await asyncio.sleep(1)
    await asyncio.to_thread(stack_cmd, "up", "--workers", "1")
    recover = await time_to_progress(stack, run_id, 180)
    await finish(stack, f"04 Kafka restart ({how})", run_id, ids, t0, recover, timeout=300)


@pytest.mark.fast
async def test_05_aggregator_dies_between_write_and_commit(
    stack: Settings, group: Group, tmp_path: Path
) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 1500, "aggx")
    await wait_rows(stack, run_id, 100, 60)
    stack_cmd("stop", "aggregator")
    # It may die before it ever reports healthy (a backlog is waiting): don't wait on `up`.
    with contextlib.suppress(subprocess.CalledProcessError):
        stack_cmd("up", env={"FAULT_INJECT": "aggregator_exit_after_write=3"})

    async def died() -> None:
        import os

        from tests.faults.harness import stack_pid

        while True:
            try:
                os.kill(stack_pid("aggregator"), 0)
            except (ProcessLookupError, FileNotFoundError):
                return
            await asyncio.sleep(0.1)

    await asyncio.wait_for(died(), 60)
    written = await count_rows(stack, run_id)
    stack_cmd("up")  # restarts it without the crash point
    recover = await time_to_progress(stack, run_id, 90)
    await finish(
        stack,
        "05 kill -9 aggregator between DB write and commit",
        run_id,
        ids,
        t0,
        recover,
        rows_at_crash=written,
    )


async def test_06_restart_postgres_mid_run(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 2000, "pg")
    await wait_rows(stack, run_id, 300, 60)
    stack_cmd("stop", "postgres")
    await asyncio.sleep(5)
    stack_cmd("up", "--workers", "1")
    recover = await time_to_progress(stack, run_id, 120)
    await finish(stack, "06 PostgreSQL restart", run_id, ids, t0, recover)


async def test_07_s3_unavailable_for_30s(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 3000, "s3")
    await wait_rows(stack, run_id, 300, 60)
    stack_cmd("stop", "s3")
    await asyncio.sleep(30)
    stack_cmd("up", "--workers", "1")
    recover = await time_to_progress(stack, run_id, 120)
    await finish(stack, "07 S3 store down for 30 s", run_id, ids, t0, recover)


# --------------------------------------------------------------------------- bad messages


@pytest.mark.fast
async def test_08_poison_message_on_every_topic(stack: Settings, group: Group, tmp_path: Path) -> None:
    import asyncpg

    await group.start(stack)
    poison = b"\xff\xfe not a message " + unique("poison").encode()
    targets = [
        topics.JOBS,
        topics.SHARDS,
        topics.work_topic(group.name),
        topics.RESULTS,
        topics.RETRY,
        topics.DLQ,
        topics.HEARTBEATS,
    ]
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for topic in targets:
            await producer.send_and_wait(topic, poison, key=b"poison")
    finally:
        await producer.stop()
    # every partition keeps moving: a run behind the poison completes
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 200, "poison")
    await finish(stack, "08 poison message on every topic", run_id, ids, t0, None)
    conn = await asyncpg.connect(stack.database_url)
    try:
        rows = await conn.fetch("SELECT original_topic, headers FROM dead_letters WHERE payload = $1", poison)
    finally:
        await conn.close()
    seen = {r["original_topic"] or topics.DLQ for r in rows}
    assert seen >= set(targets), f"dead letters for {sorted(seen)}, expected {sorted(targets)}"
    import json

    for r in rows:
        if r["original_topic"] is None:
            continue  # the copy published straight onto eval.dlq has no headers to keep
        headers = json.loads(r["headers"])
        assert headers.get("x-error") and headers.get("x-error-type"), (r["original_topic"], headers)


@pytest.mark.fast
async def test_09_redrive_dead_letters_twice(stack: Settings, spawn, tmp_path: Path) -> None:
    from tests.e2e.helpers import evalctl

    faulty = Group(stack, spawn, delay_ms=0, ENGINE_FAULTS="permanent=0.1,seed=3")
    await faulty.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, faulty, 300, "redrive")
    await wait_completed(stack, run_id, 120)
    failed_before = (await check_invariant(stack, run_id, ids)).failures

    async def dead_letters() -> int:
        conn = await asyncpg.connect(stack.database_url)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", run_id))
        finally:
            await conn.close()

    for _ in range(2):
        before = await dead_letters()
        evalctl("dlq", "redrive", run_id)
        # the permanent failures fail again: wait until each is back in the dead letters
        await wait_until(
            lambda before=before: _at_least(dead_letters, before + failed_before),
            90,
            what="the redriven items to come back",
        )
    inv = await check_invariant(stack, run_id, ids)
    record("09 redrive dead letters twice", inv, None, time.monotonic() - t0)
    assert inv.holds and inv.failures == failed_before > 0, summary(inv)


async def _at_least(count, n: int) -> bool:
    return bool(await count() >= n)


# --------------------------------------------------------------------------- producer, scaling, router


async def test_10_kill_9_producer_while_publishing(stack: Settings, spawn, tmp_path: Path) -> None:
    from tests.support import topic_end_offsets

    group = Group(stack, spawn, delay_ms=0)  # the engine is not the point here: publishing is
    await group.start(stack)
    before = sum((await topic_end_offsets(stack.kafka_bootstrap, topics.SHARDS)).values())
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 20000, "prod", shard_size=5)
    published = 0
    while published < 200:
        published = sum((await topic_end_offsets(stack.kafka_bootstrap, topics.SHARDS)).values()) - before
    kill("producer")
    published = sum((await topic_end_offsets(stack.kafka_bootstrap, topics.SHARDS)).values()) - before
    stack_cmd("up", "--workers", "1")
    recover = await time_to_progress(stack, run_id, 120)
    await finish(
        stack,
        "10 kill -9 producer while publishing",
        run_id,
        ids,
        t0,
        recover,
        timeout=600,
        shards_before_kill=published,
        shards_total=8000,
    )


async def test_11_scale_workers_1_3_1_under_load(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 4000, "scale")
    await wait_rows(stack, run_id, 400, 60)
    await group.start(stack, 2)  # 1 -> 3
    await wait_rows(stack, run_id, 2000, 120)
    for w in group.workers[1:]:  # 3 -> 1: graceful stops (drain, commit)
        w.stop()
    await finish(stack, "11 scale workers 1 -> 3 -> 1", run_id, ids, t0, None)


async def test_12_transient_and_permanent_engine_errors(stack: Settings, spawn, tmp_path: Path) -> None:
    faults = "transient=0.1,permanent=0.01,seed=12"
    faulty = Group(stack, spawn, delay_ms=0, ENGINE_FAULTS=faults)
    await faulty.start(stack)
    t0 = time.monotonic()
    n = 20000
    run_id, ids = await start_run(
        stack, tmp_path, faulty, n, "chaos", shard_size=50, max_attempts=8, base_delay_s=0.2, multiplier=2.0
    )
    await wait_completed(stack, run_id, 600)
    inv = await check_invariant(stack, run_id, ids)
    plan = FaultPlan.parse(faults)
    permanent = {i for i in ids if plan.planned_failure(i, 1) == "permanent"}
    import asyncpg

    conn = await asyncpg.connect(stack.database_url)
    try:
        failed = {
            r["item_id"]
            for r in await conn.fetch(
                "SELECT item_id FROM item_results WHERE run_id = $1 AND error IS NOT NULL", run_id
            )
        }
    finally:
        await conn.close()
    record(
        "12 10% transient + 1% permanent engine errors",
        inv,
        None,
        time.monotonic() - t0,
        failure_rate=round(len(failed) / n, 5),
        permanent_rate=round(len(permanent) / n, 5),
    )
    assert inv.holds, summary(inv)
    assert failed == permanent  # every transient error healed by a retry; only the permanent ones fail


@pytest.mark.fast
async def test_13_router_killed_and_restarted(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    t0 = time.monotonic()
    run_id, ids = await start_run(stack, tmp_path, group, 1500, "router")
    await wait_rows(stack, run_id, 200, 60)
    kill("router")
    await asyncio.sleep(2)
    stack_cmd("up", "--workers", "1")
    recover = await time_to_progress(stack, run_id, 90)
    await finish(stack, "13 router killed and restarted", run_id, ids, t0, recover)
