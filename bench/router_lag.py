"""Router benchmark: two worker groups, one 4× slower; lag-aware policies vs round robin.

On the running stack (`make up`), in one invocation: a fast and a slow worker group (the
slow one's engine sleeps 4× longer per item, ENGINE_DELAY_MS), then, for each policy, a
router of its own (private input topic, ROUTER_GROUPS = the two groups) and a run of the
same size through it. Each run gets its own items, so none is served from the answer cache.

Per policy: makespan (first shard published -> last item result on eval.results), p95 of
item latency from submission to result, p95 after routing (work-topic publish -> result),
and how many items each group served. The groups serve a `replay:` model unique to this
invocation (instant answers, like `null`) so that no other router on the stack feeds them
anybody else's shards, and ours reach no other group.

    .venv/bin/python bench/router_lag.py [--items 1600] [--delay-ms 10]

Prints JSON and writes bench/results/router_lag.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.* helpers when run as a script

from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: E402

from evalstream.common import topics  # noqa: E402
from evalstream.common.lag import group_lag  # noqa: E402
from evalstream.common.messages import GenerationParams, JobSpec, Shard, ShardResult, decode  # noqa: E402
from evalstream.common.settings import Settings  # noqa: E402
from evalstream.common.topics_admin import ensure_topics  # noqa: E402
from tests.e2e.helpers import arithmetic_items, write_jsonl  # noqa: E402
from tests.e2e.router_helpers import (  # noqa: E402
    create_topic,
    publish_heartbeats,
    replay_answers,
    router_env,
    submit_private,
)
from tests.replay_files import replay_dir, replay_env  # noqa: E402
from tests.support import (  # noqa: E402
    ServiceProcess,
    admin_kafka,
    admin_settings,
    free_port,
    topic_end_offsets,
    unique,
    upload_dataset,
)

POLICIES = ("weighted", "least_outstanding", "round_robin")
RESULTS = ROOT / "bench" / "results" / "router_lag.json"


def spawn(module: str, log_dir: Path, name: str, env: dict[str, str]) -> tuple[ServiceProcess, int]:
    port = free_port()
    proc = ServiceProcess(
        module, {"HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1", **env}, log_dir / f"{name}.log"
    ).start()
    return proc, port


def policy_weights(port: int) -> dict[str, float]:
    """The weighted policy's weights as the router last adapted them (its /metrics)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(r'^evalstream_router_policy_weight\{term="(\w+)"\} ([0-9.e+-]+)$', text, re.M)
    return {term: round(float(v), 3) for term, v in found}


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


async def collect_results(
    run_id: str, start: dict[int, int], expected: int, timeout: float
) -> dict[str, tuple[float, str, str]]:
    """item id -> (time of its result on eval.results, served_by, shard id), until all
    `expected` are in."""
    consumer = AIOKafkaConsumer(**admin_kafka(), enable_auto_commit=False)
    await consumer.start()
    seen: dict[str, tuple[float, str, str]] = {}
    try:
        tps = [TopicPartition(topics.RESULTS, p) for p in start]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start[tp.partition])
        deadline = time.monotonic() + timeout
        while len(seen) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id}: {len(seen)}/{expected} results after {timeout}s")
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    if run_id.encode() not in (r.value or b""):
                        continue
                    result = decode(r.value or b"", ShardResult)
                    for item in result.results:
                        seen.setdefault(item.item_id, (r.timestamp / 1000, item.served_by, result.shard_id))
    finally:
        await consumer.stop()
    return seen


async def routed_at(groups: list[str], starts: dict[str, dict[int, int]], run_id: str) -> dict[str, float]:
    """shard id -> when the router published it to a work topic (first time)."""
    out: dict[str, float] = {}
    consumer = AIOKafkaConsumer(**admin_kafka(), enable_auto_commit=False)
    await consumer.start()
    try:
        for g in groups:
            tps = [TopicPartition(topics.work_topic(g), p) for p in starts[g]]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, starts[g][tp.partition])
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for r in records:
                        if run_id.encode() in (r.value or b""):
                            shard = decode(r.value or b"", Shard)
                            out.setdefault(shard.shard_id, r.timestamp / 1000)
    finally:
        await consumer.stop()
    return out


async def drained(groups: list[str]) -> bool:
    lags = [
        sum(
            (
                await group_lag(admin_settings(), topics.worker_consumer_group(g), topics.work_topic(g))
            ).values()
        )
        for g in groups
    ]
    return not any(lags)


async def run_policy(
    settings: Settings,
    policy: str,
    groups: list[str],
    model: str,
    items: list[dict[str, Any]],
    shard_size: int,
    work: Path,
) -> dict[str, Any]:
    inbox = unique(f"eval.shards.bench-{policy.replace('_', '-')}")
    await create_topic(inbox)
    router, port = spawn(
        "evalstream.router",
        work,
        f"router-{policy}",
        router_env(inbox, groups, ROUTER_POLICY=policy, ROUTER_MAX_LAG="4"),
    )
    try:
        await asyncio.to_thread(router.wait_healthy, port)
        await asyncio.sleep(2)  # the router has read the heartbeats and one round of lag
        starts = {g: await topic_end_offsets(topics.work_topic(g)) for g in groups}
        results_start = await topic_end_offsets(topics.RESULTS)
        run_id = unique(f"bench-{policy.replace('_', '-')}")
        dataset = write_jsonl(work / f"{policy}.jsonl", items)
        job = JobSpec(
            dataset=upload_dataset(settings, dataset),
            model=model,
            run_id=run_id,
            shard_size=shard_size,
            generation=GenerationParams(max_tokens=16),
            name=f"bench router_lag {policy}",
        )
        collector = asyncio.create_task(collect_results(run_id, results_start, len(items), 600))
        submitted = time.time()
        await submit_private(inbox, job)  # as the producer does, with its credentials
        seen = await collector
        routed = await routed_at(groups, starts, run_id)
        weights = await asyncio.to_thread(policy_weights, port)
    finally:
        router.stop()
    # the clock starts when the first shard reached a group (the producer's validation and
    # uploads before that are the same for every policy)
    t0 = min(routed.values(), default=submitted)
    done = [ts for ts, _, _ in seen.values()]
    after_routing = [ts - routed[shard] for ts, _, shard in seen.values() if shard in routed]
    served: dict[str, int] = {}
    for _, by, _ in seen.values():
        group = by.split("/", 1)[0]
        served[group] = served.get(group, 0) + 1
    return {
        "policy": policy,
        "run_id": run_id,
        "items": len(items),
        "shards": len(routed),
        "makespan_s": round(max(done) - t0, 2),
        "p95_latency_s": round(p95([ts - t0 for ts in done]), 2),
        "p50_latency_s": round(statistics.median([ts - t0 for ts in done]), 2),
        "p95_after_routing_s": round(p95(after_routing), 2),
        "items_per_group": served,
        "adapted_weights": weights if policy == "weighted" else None,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings.from_env()
    work = Path(tempfile.mkdtemp(prefix="bench-router-"))
    fast, slow = unique("bench-fast"), unique("bench-slow")
    groups = [fast, slow]
    await ensure_topics(admin_settings(), groups)
    # items of their own per run: the same prompt would be an answer-cache hit the second time
    phases = {
        p: [
            {**it, "question": f"[{p}] {it['question']}"}
            for it in arithmetic_items(args.items, prefix=f"{p}-")
        ]
        for p in POLICIES
    }
    # under the workers' REPLAY_ROOT, the only folder they read replay files from
    model = replay_answers(
        replay_dir("bench-router") / "answers.jsonl", [it for its in phases.values() for it in its]
    )
    common = {"WORKER_MODEL": model, "WORKER_MAX_SHARDS": "2", "HEARTBEAT_INTERVAL_S": "1", **replay_env()}
    workers = [
        spawn(
            "evalstream.worker",
            work,
            fast,
            {**common, "WORKER_GROUP": fast, "WORKER_ID": f"{fast}-0", "ENGINE_DELAY_MS": str(args.delay_ms)},
        ),
        spawn(
            "evalstream.worker",
            work,
            slow,
            {
                **common,
                "WORKER_GROUP": slow,
                "WORKER_ID": f"{slow}-0",
                "ENGINE_DELAY_MS": str(4 * args.delay_ms),
            },
        ),
    ]
    started = time.monotonic()
    out: dict[str, Any] = {}
    try:
        for proc, port in workers:
            await asyncio.to_thread(proc.wait_healthy, port)
        for policy in POLICIES:
            out[policy] = await run_policy(
                settings, policy, groups, model, phases[policy], args.shard_size, work
            )
            for _ in range(120):  # the next phase starts on empty queues
                if await drained(groups):
                    break
                await asyncio.sleep(0.5)
    finally:
        for proc, _ in workers:
            proc.stop()
        await publish_heartbeats([(f"{g}-0", None) for g in groups])
    rr, lag_aware = out["round_robin"], out["weighted"]
    summary = {
        "benchmark": "router_lag",
        "setup": {
            "items_per_run": args.items,
            "shard_size": args.shard_size,
            "groups": {
                "fast": {"delay_ms_per_item": args.delay_ms},
                "slow": {"delay_ms_per_item": 4 * args.delay_ms},
            },
            "router_max_lag": 4,
            "worker_max_shards": 2,
        },
        "runs": out,
        "weighted_vs_round_robin": {
            "makespan_ratio": round(lag_aware["makespan_s"] / rr["makespan_s"], 3),
            "finishes_sooner_by": round(1 - lag_aware["makespan_s"] / rr["makespan_s"], 3),
            "p95_ratio": round(lag_aware["p95_latency_s"] / rr["p95_latency_s"], 3),
            "meets_target": lag_aware["makespan_s"] <= 0.7 * rr["makespan_s"]
            and lag_aware["p95_latency_s"] < rr["p95_latency_s"],
        },
        "bench_wall_s": round(time.monotonic() - started, 1),
    }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1600, help="items per run (one run per policy)")
    ap.add_argument("--shard-size", type=int, default=20)
    ap.add_argument("--delay-ms", type=float, default=10.0, help="per-item delay of the fast group")
    args = ap.parse_args()
    summary = asyncio.run(main_async(args))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if not summary["weighted_vs_round_robin"]["meets_target"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
