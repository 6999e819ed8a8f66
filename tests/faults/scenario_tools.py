"""What the fault scenarios share (tests/faults/test_scenarios_*.py, tests/faults/test_host_faults.py):
worker groups of their own, run sizes, the deadline, the verdict every scenario must pass,
and waits for a process or a port to be gone and for results to pile up.

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
starts (null engine slowed by ENGINE_DELAY_MS so that faults land mid-run)."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient

from evalstream.common import topics
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.faults.evidence import alive_pid
from tests.faults.harness import scaled, wait_for
from tests.faults.scenario import Scenario, ScenarioResult
from tests.support import ServiceProcess, admin_kafka, admin_settings, unique
from tests.support import topic_end_offsets as end_offsets

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
