"""Fault scenarios (issues 6 and 14) that break the infrastructure, or what travels on it,
while several runs are in flight, then let the checker (checker.py) judge every effect of
every item: Kafka restarted (cleanly and with kill -9), the aggregator killed between its
database write and its commit, PostgreSQL restarted, S3 down; a poison message on every
topic, and dead letters redriven twice. The pipeline's own processes:
tests/faults/test_scenarios_processes.py.

How every scenario runs, and what it must show: tests/faults/scenario_tools.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common import topics
from evalstream.common.settings import Settings
from tests.faults.harness import kill, run_ids, wait_for
from tests.faults.scenario_tools import (
    DEADLINE_S,
    Group,
    pid_gone,
    port_closed,
    results_piling_up,
    scenario,
    sizes,
    verdict,
)
from tests.support import admin_database_url, admin_kafka, stack_cmd, unique

# healthy_stack (conftest.py): every scenario starts from a whole stack
pytestmark = [pytest.mark.stack, pytest.mark.faults, pytest.mark.usefixtures("healthy_stack")]


# --------------------------------------------------------------------------- infrastructure


@pytest.mark.parametrize("how", ["clean", "kill -9"])
async def test_04_restart_kafka_mid_run(stack: Settings, spawn, tmp_path: Path, how: str) -> None:
    # a slower engine: a broker's clean shutdown takes seconds, the runs must outlast it
    group = Group(spawn, delay_ms=25)
    await group.start(stack)
    sc = await scenario(f"04 Kafka restart ({how})", stack, group)
    big, *others = sizes(floor=200, base=(2000, 1200, 600, 300))
    late_id, *ids = run_ids("kafka", 4)
    await asyncio.gather(*(sc.submit(tmp_path, group.name, n, r) for n, r in zip(others, ids, strict=True)))
    await sc.in_flight(at_least_rows=20)
    await sc.fault_begins()
    if how == "clean":
        stack_cmd("stop", "kafka")
    else:
        kill("kafka")
        await port_closed(stack_port(stack.kafka_bootstrap))
    await sc.assert_in_flight()
    # a run submitted while the broker is away: its client retries until it is back
    late = asyncio.create_task(sc.submit(tmp_path, group.name, big, late_id))
    sc.fault_ends()
    await sc.restart_stack("--workers", "1")
    await asyncio.wait_for(late, 360)
    verdict(await sc.judge(DEADLINE_S))


def stack_port(bootstrap: str) -> int:
    return int(bootstrap.rsplit(":", 1)[1])


async def test_05_aggregator_dies_between_write_and_commit(stack: Settings, spawn, tmp_path: Path) -> None:
    # Restarted, the aggregator writes its backlog in up to 200-record batches: the runs must
    # go on producing results past its third write (a slower engine, runs of 250 and more).
    group = Group(spawn, delay_ms=40)
    await group.start(stack)
    sc = await scenario("05 kill -9 aggregator between DB write and commit", stack, group)
    await sc.submit_many(tmp_path, group.name, sizes(floor=250), "aggx")
    await sc.in_flight(at_least_rows=10)
    await sc.fault_begins()
    stack_cmd("stop", "aggregator")
    # It dies at its first write (it shares the results with the other aggregator: a later
    # one might come after the runs), maybe before it ever reports healthy: don't wait on `up`.
    await sc.restart_stack(env={"FAULT_INJECT": "aggregator_exit_after_write=1"}, check=False)
    await pid_gone("aggregator")
    sc.extra["rows_at_crash"] = sum((await sc.assert_in_flight()).values())
    sc.fault_ends()
    await sc.restart_stack()  # without the crash point
    verdict(await sc.judge(DEADLINE_S))


async def test_06_restart_postgres_mid_run(stack: Settings, spawn, tmp_path: Path) -> None:
    group = Group(spawn, delay_ms=25)  # the runs outlast the store's shutdown
    await group.start(stack)
    sc = await scenario("06 PostgreSQL restart", stack, group)
    big, *others = sizes(floor=200, base=(2000, 1200, 600, 300))
    late_id, *ids = run_ids("pg", 4)
    await asyncio.gather(*(sc.submit(tmp_path, group.name, n, r) for n, r in zip(others, ids, strict=True)))
    await sc.in_flight(at_least_rows=20)
    await sc.assert_in_flight()
    await sc.fault_begins()
    stack_cmd("stop", "postgres")
    # the producer cannot record it yet: this run provably had not finished at the fault
    await sc.submit(tmp_path, group.name, big, late_id)
    await results_piling_up(sc, 5)
    sc.fault_ends()
    await sc.restart_stack("--workers", "1")
    verdict(await sc.judge(DEADLINE_S))


async def test_07_s3_unavailable(stack: Settings, spawn, tmp_path: Path) -> None:
    group = Group(spawn, delay_ms=50)  # the runs outlast the S3 server's slow shutdown
    await group.start(stack)
    sc = await scenario("07 S3 store down", stack, group)
    big, *others = sizes(floor=300, base=(3000, 1500, 800, 400))
    late_id, *ids = run_ids("s3", 4)
    await asyncio.gather(*(sc.submit(tmp_path, group.name, n, r) for n, r in zip(others, ids, strict=True)))
    staged = await sc.stage(tmp_path, big, late_id)  # uploaded before the outage, as evalctl would
    await sc.in_flight(at_least_rows=20)
    await sc.fault_begins()
    stack_cmd("stop", "s3")
    await sc.assert_in_flight()
    await sc.submit(tmp_path, group.name, big, late_id, staged=staged)  # the producer cannot copy it yet
    await results_piling_up(sc, 5)
    sc.fault_ends()
    await sc.restart_stack("--workers", "1")
    verdict(await sc.judge(DEADLINE_S))


# --------------------------------------------------------------------------- bad messages


async def test_08_poison_message_on_every_topic(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    poison = b"\xff\xfe not a message " + unique("poison").encode()
    targets = [
        topics.JOBS,
        topics.SHARDS,
        group.topic,
        topics.RESULTS,
        topics.RETRY,
        topics.DLQ,
        topics.HEARTBEATS,
    ]
    sc = await scenario("08 poison message on every topic", stack, group)
    producer = AIOKafkaProducer(**admin_kafka(), acks="all")
    await producer.start()
    try:
        for topic in targets:  # on every partition the runs use
            for p in range(3):
                await producer.send_and_wait(
                    topic, poison, key=b"poison", partition=p if topic != topics.HEARTBEATS else 0
                )
    finally:
        await producer.stop()
    # every partition keeps moving: runs behind the poison complete
    await sc.submit_many(tmp_path, group.name, sizes(floor=40, base=(300, 200, 100, 60)), "poison")
    verdict(await sc.judge(DEADLINE_S))

    async def letters() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(admin_database_url())  # payloads are not the users' to read
        try:
            return list(
                await conn.fetch(
                    "SELECT original_topic, headers FROM dead_letters WHERE payload = $1", poison
                )
            )
        finally:
            await conn.close()

    async def every_topic() -> bool:
        return {r["original_topic"] or topics.DLQ for r in await letters()} >= set(targets)

    await wait_for(every_topic, 120, "a dead letter of the poison from every topic")
    for r in await letters():
        if r["original_topic"] is None:
            continue  # the copy published straight onto eval.dlq has no headers to keep
        headers = json.loads(r["headers"])
        assert headers.get("x-error") and headers.get("x-error-type"), (r["original_topic"], headers)


async def test_09_redrive_dead_letters_twice(stack: Settings, spawn, tmp_path: Path) -> None:
    from tests.e2e.helpers import evalctl

    faulty = Group(spawn, delay_ms=0, ENGINE_FAULTS="permanent=0.1,seed=3")
    await faulty.start(stack)
    sc = await scenario("09 redrive dead letters twice", stack, faulty)
    runs = await sc.submit_many(tmp_path, faulty.name, sizes(floor=100, base=(400, 300, 200, 100)), "redrive")
    first = await sc.judge(DEADLINE_S)
    verdict(first)
    conn = await asyncpg.connect(stack.database_url)
    try:

        async def failed(run_id: str) -> int:
            return int(
                await conn.fetchval(
                    "SELECT count(*) FROM item_results WHERE run_id = $1 AND error IS NOT NULL", run_id
                )
            )

        async def letters(run_id: str) -> int:
            return int(await conn.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", run_id))

        failed_before = {r.run_id: await failed(r.run_id) for r in runs}
        assert all(failed_before.values()), failed_before  # 10 % of every run fails for good
        for _ in range(2):
            for run in runs:
                before = await letters(run.run_id)
                evalctl("dlq", "redrive", run.run_id)

                async def back(run_id: str = run.run_id, n: int = before + failed_before[run.run_id]) -> bool:
                    return await letters(run_id) >= n

                # the permanent failures fail again: each comes back to the dead letters
                await wait_for(back, 180, f"the redriven items of {run.run_id} to come back")
        assert {r.run_id: await failed(r.run_id) for r in runs} == failed_before
    finally:
        await conn.close()
    verdict(await sc.judge(DEADLINE_S))
