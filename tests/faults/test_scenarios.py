"""Fault scenarios (issues 6 and 14): break one thing while several runs are in flight, then
let the checker (checker.py) judge every effect of every item.

Every scenario runs at least four runs at once, of different sizes, with run ids drawn at
random: each run's shards and results spread over every partition (spread.py), and the fault
stack runs two routers and two aggregators (`make test-faults`), so a batch chains records of
several runs and partitions through its nack, commit and redelivery paths, and one run is
served by several processes of every kind.
Outages also take a run submitted while they last. Faults are injected while the runs are
provably in flight (rows < total, checked right after the injection), and every wait has a
deadline and says what it waited for; durations are reported in faults.json, never asserted.

`make test-faults` runs them at full size (FAULTS_SCALE=1, bench/results/faults.json);
`make test` runs every one scaled down (tests/artifacts/faults.json). Both on a stack of
their own (ports shifted), so that killing its broker or database disturbs nobody.

Each scenario pins its runs to a worker group of its own, served by workers the test
starts (null engine slowed by ENGINE_DELAY_MS so that faults land mid-run).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import asyncpg
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from evalstream.common import topics
from evalstream.common.lag import topic_partitions
from evalstream.common.messages import ShardResult, decode
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from evalstream.worker.engines.testhooks import FaultPlan
from tests.faults.harness import (
    Scenario,
    ScenarioResult,
    alive_pid,
    end_offsets,
    kill,
    run_ids,
    scaled,
    stack_cmd,
    wait_for,
)
from tests.support import (
    ServiceProcess,
    admin_database_url,
    admin_kafka,
    admin_settings,
    read_records,
    unique,
)

pytestmark = [pytest.mark.stack, pytest.mark.faults]

# Four runs of different sizes (full scale); scaled(), never below what a scenario needs.
SIZES = (1500, 1000, 600, 300)


def sizes(floor: int = 60, base: tuple[int, ...] = SIZES) -> list[int]:
    return [scaled(n, floor) for n in base]


# A whole scenario, under the busiest machine: runs complete well within it.
DEADLINE_S = 600


class Group:
    """A worker group of the test's own: its workers can be killed, paused and scaled."""

    def __init__(self, spawn, delay_ms: int, **env: str) -> None:
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

    @property
    def topic(self) -> str:
        return topics.work_topic(self.name)

    async def start(self, settings: Settings, n: int = 1, **env: str) -> None:
        await ensure_topics(admin_settings(), [self.name])
        for _ in range(n):
            proc, port = self.spawn("evalstream.worker", **{**self.env, **env})
            await asyncio.to_thread(proc.wait_healthy, port)
            self.workers.append(proc)

    async def members(self, settings: Settings) -> int:
        """Members of the group's Kafka consumer group, as the broker sees them now."""
        admin = AIOKafkaAdminClient(**admin_kafka())
        await admin.start()
        try:
            described = await admin.describe_consumer_groups([topics.worker_consumer_group(self.name)])
        finally:
            await admin.close()
        # raw DescribeGroups responses, one per coordinator: (error, id, state, protocol
        # type, protocol, members, ...) per group
        return sum(len(g[5]) for resp in described for g in resp.groups)


@pytest.fixture(autouse=True)
def healthy_stack(stack: Settings) -> None:
    """Every scenario starts from a whole stack, whatever the one before it broke."""
    stack_cmd("up")


@pytest.fixture
def group(spawn) -> Group:
    return Group(spawn, delay_ms=10)


async def scenario(name: str, stack: Settings, group: Group) -> Scenario:
    return await Scenario(name, stack, group.topic).begin()


RESULT_PARTITIONS = 6  # eval.results on the fault stack (KAFKA_PARTITIONS_RESULTS)


def verdict(result: ScenarioResult) -> None:
    """The invariant of every scenario: every run completed, no anomaly in any effect, and
    each run's results spread over min(its shards, the partitions) of eval.results."""
    assert result.not_done is None and result.ok, result.explain()
    spread = result.extra["result_partitions_by_run"]
    for run_id, shards in result.extra["shards_by_run"].items():
        assert len(spread[run_id]) == min(shards, RESULT_PARTITIONS), (run_id, shards, spread[run_id])


async def pid_gone(name: str, timeout: float = 60) -> None:
    async def gone() -> bool:
        return alive_pid(name) is None

    await wait_for(gone, timeout, f"the {name} process to be gone")


async def port_closed(port: int, timeout: float = 60) -> None:
    async def closed() -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
        except OSError:
            return True
        writer.close()
        return False

    await wait_for(closed, timeout, f"port {port} to close")


async def results_piling_up(sc: Scenario, at_least: int, timeout: float = 180) -> None:
    """An outage of the aggregator's stores lasts until workers have published results it
    could not write: the point of the scenario is the backlog, not a number of seconds."""
    start = sc.results_at_fault or {}  # counted from the fault's beginning

    async def piled() -> bool:
        now = await end_offsets(topics.RESULTS)
        return sum(now.values()) - sum(start.values()) >= at_least

    await wait_for(piled, timeout, f"{at_least} results published during the outage")


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
