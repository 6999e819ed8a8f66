"""Fault scenarios (issues 6 and 14) that break the pipeline's own processes while several
runs are in flight, then let the checker (checker.py) judge every effect of every item: a
worker killed mid-batch, paused past its session timeout, or busy longer than the poll
interval; the producer killed while publishing; workers scaled 1 -> 3 -> 1 under load;
transient and permanent engine errors; a router killed and restarted; a router, an aggregator
and a worker killed in one spread run. The infrastructure's faults:
tests/faults/test_scenarios_infrastructure.py.

How every scenario runs, and what it must show: tests/faults/scenario_tools.py."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import asyncpg
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer

from evalstream.common import topics
from evalstream.common.lag import topic_partitions
from evalstream.common.messages import ShardResult, decode
from evalstream.common.settings import Settings
from evalstream.worker.engines.testhooks import FaultPlan
from tests.faults.harness import kill, scaled, wait_for
from tests.faults.scenario_tools import DEADLINE_S, Group, pid_gone, scenario, sizes, verdict
from tests.support import admin_kafka, read_records
from tests.support import topic_end_offsets as end_offsets

# healthy_stack (conftest.py): every scenario starts from a whole stack
pytestmark = [pytest.mark.stack, pytest.mark.faults, pytest.mark.usefixtures("healthy_stack")]


# --------------------------------------------------------------------------- workers


async def test_01_kill_9_worker_mid_batch(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    sc = await scenario("01 kill -9 worker mid-batch", stack, group)
    # Big enough at any scale that the kill hits while every run is going (one worker at
    # 10 ms an item: 2,400 items are 24 s of work at 0.2)
    await sc.submit_many(tmp_path, group.name, sizes(floor=600), "k9w")
    await sc.in_flight(at_least_rows=20)
    await sc.fault_begins()
    group.workers[0].signal(signal.SIGKILL)
    await sc.assert_in_flight()
    sc.fault_ends()
    await group.start(stack)  # a replacement, as a supervisor would start
    verdict(await sc.judge(DEADLINE_S))


async def test_02_sigstop_worker_past_session_timeout(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack, 2)
    sc = await scenario("02 SIGSTOP worker > session timeout, SIGCONT", stack, group)
    # Big enough at any scale that the worker left alone (delay 10 ms: 100 items/s at most)
    # is still busy when the paused one is evicted (about 15 s later): 6,000 items at 0.2.
    await sc.submit_many(tmp_path, group.name, sizes(floor=1500, base=(3000, 2000, 1500, 1500)), "stop")
    await sc.in_flight(at_least_rows=20)
    await sc.fault_begins()
    group.workers[1].signal(signal.SIGSTOP)
    await sc.assert_in_flight()

    async def evicted() -> bool:  # the session timeout passed: the group dropped it
        return await group.members(stack) == 1

    sc.extra["evicted_after_s"] = round(await wait_for(evicted, 120, "the paused worker's eviction", 1.0), 1)
    await sc.assert_in_flight()
    group.workers[1].signal(signal.SIGCONT)  # its late commit must fail, not lose or duplicate
    sc.fault_ends()
    verdict(await sc.judge(DEADLINE_S))


async def test_03_batch_longer_than_poll_interval(stack: Settings, spawn, tmp_path: Path) -> None:
    # One shard per batch, 50 items x 200 ms = 10 s per batch, against a 4 s poll interval.
    slow = Group(spawn, delay_ms=200, WORKER_MAX_SHARDS="1", WORKER_MAX_POLL_INTERVAL_MS="4000")
    await slow.start(stack)
    sc = await scenario("03 batch longer than the poll interval", stack, slow)
    await sc.submit_many(
        tmp_path, slow.name, sizes(floor=50, base=(150, 100, 100, 50)), "poll", shard_size=50
    )
    verdict(await sc.judge(DEADLINE_S))


# --------------------------------------------------------------------------- producer, scaling, router


async def test_10_kill_9_producer_while_publishing(stack: Settings, spawn, tmp_path: Path) -> None:
    group = Group(spawn, delay_ms=0)  # the engine is not the point here: publishing is
    await group.start(stack)
    sc = await scenario("10 kill -9 producer while publishing", stack, group)
    # The big run is never scaled down: on a quiet machine the producer publishes a few
    # hundred shards between two polls, and the kill has to land before its last one.
    big = 20000
    # One consumer, polled without pause: opening one per poll (SASL handshake, metadata)
    # took longer than publishing a whole small suite.
    shards = AIOKafkaConsumer(**admin_kafka(), request_timeout_ms=10_000)
    await shards.start()
    try:
        partitions = await topic_partitions(shards, topics.SHARDS)

        async def published() -> int:
            return sum((await shards.end_offsets(partitions)).values()) - before

        before = 0
        before = await published()
        await sc.submit_many(
            tmp_path, group.name, [big, *sizes(base=(2000, 1000, 500))], "prod", shard_size=5
        )
        total = -(-sum(len(r.ids) for r in sc.runs.values()) // 5)
        deadline = asyncio.get_running_loop().time() + 180
        while await published() == 0:
            assert asyncio.get_running_loop().time() < deadline, "no shard published within 180 s"
        kill("producer")  # first: what fault_begins reads (workers' offsets) takes longer
        at_kill = await published()
        await sc.fault_begins()
    finally:
        await shards.stop()
    assert 0 < at_kill < total, f"killed after publishing {at_kill} of {total} shards"
    sc.extra["shards_before_kill"] = at_kill
    sc.fault_ends()
    await sc.restart_stack("--workers", "1")
    verdict(await sc.judge(DEADLINE_S))


async def test_11_scale_workers_1_3_1_under_load(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    sc = await scenario("11 scale workers 1 -> 3 -> 1", stack, group)
    # Three workers (300 items/s at most) must not finish while two of them start and stop.
    # The runs spread over the three: at any scale they must outlast two workers' start and
    # drain (their start alone takes seconds on a loaded machine).
    await sc.submit_many(tmp_path, group.name, sizes(floor=3000, base=(6000, 4000, 3000, 3000)), "scale")
    await sc.in_flight(at_least_rows=20)
    await group.start(stack, 2)  # 1 -> 3
    await sc.in_flight(at_least_rows=100)
    for w in group.workers[1:]:  # 3 -> 1: graceful stops (drain, commit)
        w.stop()
    await sc.assert_in_flight()  # scaled down before the runs ended
    verdict(await sc.judge(DEADLINE_S))


async def test_12_transient_and_permanent_engine_errors(stack: Settings, spawn, tmp_path: Path) -> None:
    faults = "transient=0.1,permanent=0.01,seed=12"
    faulty = Group(spawn, delay_ms=0, ENGINE_FAULTS=faults)
    await faulty.start(stack)
    sc = await scenario("12 10% transient + 1% permanent engine errors", stack, faulty)
    runs = await sc.submit_many(
        tmp_path, faulty.name, sizes(floor=500, base=(8000, 6000, 4000, 2000)), "chaos",
        shard_size=50, max_attempts=8, base_delay_s=0.2, multiplier=2.0,
    )  # fmt: skip
    result = await sc.judge(DEADLINE_S)
    verdict(result)
    plan = FaultPlan.parse(faults)
    conn = await asyncpg.connect(stack.database_url)
    try:
        failed = {
            (r["run_id"], r["item_id"])
            for r in await conn.fetch(
                "SELECT run_id, item_id FROM item_results WHERE run_id = ANY($1::text[]) AND error IS NOT NULL",
                [r.run_id for r in runs],
            )
        }
    finally:
        await conn.close()
    permanent = {(r.run_id, i) for r in runs for i in r.ids if plan.planned_failure(i, 1) == "permanent"}
    # every transient error healed by a retry; only the permanent ones fail
    assert failed == permanent and permanent


async def test_13_router_killed_and_restarted(stack: Settings, group: Group, tmp_path: Path) -> None:
    await group.start(stack)
    sc = await scenario("13 router killed and restarted", stack, group)
    await sc.submit_many(tmp_path, group.name, sizes(), "router")
    await sc.in_flight(at_least_rows=20)
    await sc.fault_begins()
    kill("router")
    await pid_gone("router")
    await sc.assert_in_flight()
    sc.fault_ends()
    await sc.restart_stack("--workers", "1")
    verdict(await sc.judge(DEADLINE_S))


async def test_16_kill_9_router_aggregator_and_worker_in_one_spread_run(
    stack: Settings, group: Group, tmp_path: Path
) -> None:
    """One big run spread over three workers, two routers and two aggregators; one of each
    killed with SIGKILL in the middle of it."""
    await group.start(stack, 3)
    sc = await scenario("16 kill -9 router, aggregator and worker in one spread run", stack, group)
    [run] = await sc.submit_many(tmp_path, group.name, [scaled(6000, 1500)], "spread")
    await sc.in_flight(at_least_rows=50)
    await sc.fault_begins()
    kill("router-1")
    kill("aggregator-1")
    group.workers[0].signal(signal.SIGKILL)
    await pid_gone("router-1")
    await pid_gone("aggregator-1")
    await sc.assert_in_flight()
    sc.fault_ends()
    await sc.restart_stack()  # the dead router and aggregator come back, as a supervisor would
    result = await sc.judge(DEADLINE_S)
    verdict(result)
    # the run was spread: three workers answered it, on every partition of eval.results
    served = {
        r.worker_id
        for record in await read_records(topics.RESULTS, sc.offsets[topics.RESULTS])
        if (r := _result_of(record.value)) is not None and r.run_id == run.run_id
    }
    assert len(served) >= 3, served
    assert len(result.extra["result_partitions"]) == len(await end_offsets(topics.RESULTS))


def _result_of(value: bytes | None) -> ShardResult | None:
    try:
        return decode(value or b"", ShardResult)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
