"""The router on the real broker: back-pressure, SLA fallback, and a whole group killed mid-run.

Each test runs a router process of its own on a private input topic (ROUTER_SHARDS_TOPIC)
limited to its own worker groups (ROUTER_GROUPS), so the stack's router never sees these
shards. The groups serve a `replay:` model unique to the test, so no other router sends them
anybody else's shards either. Runs are created by the producer's own intake code (manifest,
database row, dataset in S3) with the shards published to the private topic; the stack's
aggregator records the results and completes the run as usual. The helpers that do all this:
tests/e2e/router_helpers.py.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from aiokafka import AIOKafkaConsumer

from evalstream.common import topics
from evalstream.common.lag import group_lag
from evalstream.common.messages import GenerationParams, Heartbeat, JobSpec, Shard, decode
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import arithmetic_items, result_rows, write_jsonl
from tests.e2e.router_helpers import (
    FakeGroup,
    create_topic,
    metric,
    publish_heartbeats,
    publish_shards,
    replay_answers,
    router_env,
    shards_for,
    submit_private,
    wait_completed,
)
from tests.replay_files import replay_dir, replay_env
from tests.support import (
    admin_kafka,
    admin_settings,
    read_topic_since,
    topic_end_offsets,
    unique,
    upload_dataset,
    wait_until,
)

pytestmark = pytest.mark.stack


# --------------------------------------------------------------------------- tests


async def test_router_stops_taking_shards_while_every_group_is_saturated(
    stack: Settings, spawn: Any, tmp_path: Path
) -> None:
    group, inbox = unique("bp"), unique("eval.shards.bp")
    await create_topic(inbox)
    model = f"replay:{tmp_path / 'bp.jsonl'}"  # never loaded: nobody serves it for real
    async with FakeGroup(group, model):
        router, port = spawn("evalstream.router", **router_env(inbox, [group], ROUTER_MAX_LAG="3"))
        await asyncio.to_thread(router.wait_healthy, port)
        run_id = unique("run-bp")
        await publish_shards(inbox, shards_for(run_id, model, 30))
        work = topics.work_topic(group)

        async def routed() -> int:
            return sum((await topic_end_offsets(work)).values())

        await wait_until(lambda: _at_least(routed, 3), 60, what="the first shards to be routed")
        # several lag reads later (each one could have let more through): still exactly the bound
        reads = lag_reads(port, group)
        await wait_until(lambda: _true(lag_reads(port, group) >= reads + 5), 30, what="five more lag reads")
        assert await routed() == 3
        assert metric(port, "evalstream_router_backpressure_waiting") == 1.0
        # the backlog stays in Kafka: the router committed the 3 it routed, holds one
        router_group = f"{topics.ROUTER_GROUP}.{inbox}"
        assert sum((await group_lag(admin_settings(), router_group, inbox)).values()) == 27

        # Drain as a worker would (commit one shard at a time): the router follows, never
        # letting more than 3 wait on the group.
        consumer = AIOKafkaConsumer(
            work,
            **admin_kafka(),
            group_id=topics.worker_consumer_group(group),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        done, peak = 0, 0
        try:
            deadline = time.monotonic() + 60
            while done < 30 and time.monotonic() < deadline:
                record = await asyncio.wait_for(consumer.getone(), 20)
                assert decode(record.value or b"", Shard).routed_to == group
                peak = max(peak, await routed() - done)  # routed, not yet committed
                await consumer.commit()
                done += 1
                await asyncio.sleep(0.15)
        finally:
            await consumer.stop()
        assert done == 30 and peak <= 3
        await wait_until(lambda: _equals(metric_async(port), 0.0), 10, what="back-pressure to lift")


def lag_reads(port: int, group: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(
        rf'^evalstream_router_lag_reads_total{{worker_group="{re.escape(group)}"}} ([0-9.e+-]+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


async def _true(value: bool) -> bool:
    return value


async def _at_least(f: Any, n: int) -> bool:
    return bool(await f() >= n)


async def _equals(value: Any, expected: float) -> bool:
    return bool(await value == expected)


async def metric_async(port: int) -> float:
    return await asyncio.to_thread(metric, port, "evalstream_router_backpressure_waiting")


async def test_sla_fallback_sends_opted_in_runs_to_the_lighter_group_only(
    stack: Settings, spawn: Any, tmp_path: Path
) -> None:
    big_group, small_group, inbox = unique("big"), unique("small"), unique("eval.shards.sla")
    await create_topic(inbox)
    big, small = f"replay:{tmp_path / 'big.jsonl'}", f"replay:{tmp_path / 'small.jsonl'}"
    async with (
        FakeGroup(big_group, big, p95_ms=60_000),  # every heartbeat violates the SLA
        FakeGroup(small_group, small, p95_ms=100),
    ):
        env = router_env(
            inbox,
            [big_group, small_group],
            ROUTER_FALLBACK=f"{big}={small}",
            ROUTER_SLA_P95_MS="1000",
            ROUTER_SLA_TIERS="0.5",
        )
        router, port = spawn("evalstream.router", **env)
        await asyncio.to_thread(router.wait_healthy, port)
        before = {g: await topic_end_offsets(topics.work_topic(g)) for g in (big_group, small_group)}

        def tier() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            pattern = rf'^evalstream_router_sla_fallback_tier{{model="{re.escape(big)}"}} ([0-9.e+-]+)$'
            found = re.search(pattern, text, re.M)
            return float(found.group(1)) if found else 0.0

        # the router has judged the big group's heartbeats against the SLA before any shard comes
        await wait_until(lambda: _true(tier() >= 1), 60, what="the SLA fallback tier to rise")
        opted, plain = unique("run-opt"), unique("run-plain")
        await publish_shards(inbox, shards_for(opted, big, 4, opt_in=True) + shards_for(plain, big, 4))

        async def landed() -> dict[str, list[Shard]]:
            out = {}
            for g in (big_group, small_group):
                recs = await read_topic_since(topics.work_topic(g), before[g])
                out[g] = [decode(v, Shard) for _, v, _ in recs]
            return out if sum(map(len, out.values())) >= 8 else {}

        got = await wait_until(landed, 30, what="the 8 shards to be routed")
        assert {s.run_id for s in got[small_group]} == {opted} and len(got[small_group]) == 4
        assert {s.run_id for s in got[big_group]} == {plain} and len(got[big_group]) == 4
        assert all(s.served_model == small and s.model == big for s in got[small_group])
        assert all(s.served_model is None for s in got[big_group])


async def test_killing_every_worker_of_a_group_mid_run_loses_nothing(
    stack: Settings, spawn: Any, pg: asyncpg.Connection, tmp_path: Path
) -> None:
    doomed, survivor, inbox = unique("doomed"), unique("survivor"), unique("eval.shards.kill")
    await ensure_topics(admin_settings(), [doomed, survivor])
    await create_topic(inbox)
    items = arithmetic_items(600, prefix="k")
    model = replay_answers(replay_dir() / "answers.jsonl", items)
    timeout_s = 3.0
    worker_env = {
        **replay_env(),
        "WORKER_MODEL": model,
        "ENGINE_DELAY_MS": "40",
        "WORKER_MAX_SHARDS": "2",
        "HEARTBEAT_INTERVAL_S": "1",
    }
    workers = {
        f"{g}-{i}": spawn("evalstream.worker", WORKER_GROUP=g, WORKER_ID=f"{g}-{i}", **worker_env)
        for g, n in ((doomed, 2), (survivor, 1))
        for i in range(n)
    }
    env = router_env(
        inbox,
        [doomed, survivor],
        ROUTER_MAX_LAG="3",
        ROUTER_HEARTBEAT_TIMEOUT_S=str(timeout_s),
        ROUTER_REROUTE_AFTER_S="1",
    )
    router, port = spawn("evalstream.router", **env)
    for proc, p in [*workers.values(), (router, port)]:
        await asyncio.to_thread(proc.wait_healthy, p)
    starts = {g: await topic_end_offsets(topics.work_topic(g)) for g in (doomed, survivor)}
    try:
        run_id = unique("run-kill")
        job = JobSpec(
            dataset=upload_dataset(stack, write_jsonl(tmp_path / "items.jsonl", items)),
            model=model,
            run_id=run_id,
            shard_size=10,
            generation=GenerationParams(max_tokens=16),
        )
        await submit_private(inbox, job)
        cgroup, work = topics.worker_consumer_group(doomed), topics.work_topic(doomed)

        async def doomed_has_a_backlog() -> bool:
            done = await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id)
            return done >= 60 and sum((await group_lag(admin_settings(), cgroup, work)).values()) > 0

        await wait_until(doomed_has_a_backlog, 60, interval=0.2, what="the doomed group to be busy")
        for name in (f"{doomed}-0", f"{doomed}-1"):
            workers[name][0].signal(9)

        # No new shard goes to the dead group once the router sees it without a live member
        # (its heartbeats older than the timeout).
        def live_members() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            pattern = (
                rf'^evalstream_router_group_live_members{{worker_group="{re.escape(doomed)}"}} ([0-9.e+-]+)$'
            )
            found = re.search(pattern, text, re.M)
            return float(found.group(1)) if found else -1.0

        await wait_until(lambda: _true(live_members() == 0), 60, what="the router to see the group dead")
        doomed_end = await topic_end_offsets(topics.work_topic(doomed))

        await wait_completed(pg, run_id, 180)
        rows = await result_rows(pg, run_id)
        assert len(rows) == 600 and {r["item_id"] for r in rows} == {it["id"] for it in items}
        assert all(r["error"] is None and r["correct"] for r in rows)
        assert await topic_end_offsets(topics.work_topic(doomed)) == doomed_end

        # What the dead group had not finished was moved to the survivor and done there.
        sent = {
            g: {
                decode(v, Shard).shard_id
                for _, v, _ in await read_topic_since(topics.work_topic(g), starts[g])
                if run_id.encode() in v
            }
            for g in (doomed, survivor)
        }
        assert sent[doomed] & sent[survivor], "the dead group's pending shards were not re-routed"
        assert len(sent[doomed] | sent[survivor]) == 60  # every shard of the run was routed
        served = {r["served_by"] for r in rows}
        assert served == {f"{survivor}/{model}", f"{doomed}/{model}"}
    finally:
        await publish_heartbeats([(f"{doomed}-{i}", None) for i in range(2)])


async def test_a_dead_groups_backlog_parks_at_once_and_returns_when_the_group_does(
    stack: Settings, spawn: Any, tmp_path: Path
) -> None:
    """Shards pinned to a group whose workers are all dead leave the input partition for the
    retry topic right away (only the first waits ROUTER_PARK_AFTER_S), so runs behind them
    move on; when the group is back, the parked shards go to it without waiting out their
    not-before."""
    group, inbox, retry = unique("ghost"), unique("eval.shards.park"), unique("eval.retry.park")
    for topic in (inbox, retry):
        await create_topic(topic)
    model = f"replay:{tmp_path / 'ghost.jsonl'}"
    await ensure_topics(admin_settings(), [group])
    stale = Heartbeat(worker_id=f"{group}-0", group=group, model=model, ts=time.time() - 600, device="cpu")
    await publish_heartbeats([stale])  # known to the router, dead
    env = router_env(inbox, [group], ROUTER_RETRY_TOPIC=retry, ROUTER_PARK_AFTER_S="3", ROUTER_MAX_LAG="100")
    router, port = spawn("evalstream.router", **env)
    try:
        await asyncio.to_thread(router.wait_healthy, port)
        run_id = unique("run-park")
        shards = shards_for(run_id, model, 40)
        shards = [msgspec.structs.replace(s, worker_group=group) for s in shards]
        await publish_shards(inbox, shards)

        async def parked() -> int:
            return sum((await topic_end_offsets(retry)).values())

        # One shard every ROUTER_PARK_AFTER_S (the old bug) would take 120 s: the deadline is
        # below that, with room for a busy machine.
        await wait_until(lambda: _at_least(parked, 40), 90, what="the backlog to be parked")
        router_group = f"{topics.ROUTER_GROUP}.{inbox}"
        assert sum((await group_lag(admin_settings(), router_group, inbox)).values()) == 0

        # The group comes back: every parked shard is routed to it within a few seconds,
        # though each was parked with a not-before of 5 s or more.
        work = topics.work_topic(group)
        async with FakeGroup(group, model):

            async def routed() -> int:
                return sum((await topic_end_offsets(work)).values())

            # each was parked with a not-before of 5 s or more; waking on the heartbeat routes
            # them all well before their backoff (up to 30 s) would
            await wait_until(lambda: _at_least(routed, 40), 30, what="the parked shards to be routed")
        everything = dict.fromkeys(await topic_end_offsets(work), 0)
        got = {decode(v, Shard).shard_id for _, v, _ in await read_topic_since(work, everything)}
        assert got == {s.shard_id for s in shards}
    finally:
        await publish_heartbeats([(f"{group}-0", None)])
