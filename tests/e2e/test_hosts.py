"""A run across three hosts (`stack.py up --hosts 3`): worker groups in network namespaces of
their own, reaching Kafka, PostgreSQL and S3 over veth links at the infrastructure's address
on a private network, as separate machines would. The router spreads the run's shards over
the three groups; every item ends with exactly one result, and every host served some.

Needs a stack with hosts (`make up HOSTS=3`, as root): it fails, naming the command, on a
stack without them.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from evalstream.common import topics
from evalstream.common.messages import ShardResult, decode
from evalstream.common.settings import Settings
from tests.e2e.helpers import arithmetic_items, evalctl, result_rows, results_jsonl, submit_wait, write_jsonl
from tests.support import (
    STACK,
    netns_inode,
    netns_of,
    read_topic_since,
    stack_hosts,
    topic_end_offsets,
    unique,
    wait_until,
)

pytestmark = [pytest.mark.stack, pytest.mark.hosts]

HOSTS = 3


def worker_pid(name: str) -> int:
    return int((STACK / "run" / f"{name}.pid").read_text())


async def test_a_run_across_three_hosts(stack: Settings, pg: asyncpg.Connection, tmp_path: Path) -> None:
    described = stack_hosts(HOSTS)
    machines = described["machines"][:HOSTS]
    groups = {m["group"]: m for m in machines}
    host_of = {w: m["name"] for m in machines for w in m["workers"]}

    # Each host's workers really are on that host: in its network namespace, not this one.
    own = netns_of(os.getpid())
    for m in machines:
        for w in m["workers"]:
            pid = worker_pid(w)
            assert netns_of(pid) == netns_inode(m["netns"]) != own, (w, m["netns"])

    # The router sees every host's group alive (heartbeats crossed the hosts' links).
    def live_groups() -> set[str]:
        listed = json.loads(evalctl("workers", "--json").stdout)
        return {g["group"] for g in listed if g["group"] in groups and g["health"] == "healthy"}

    await wait_until(
        lambda: asyncio.to_thread(lambda: live_groups() == set(groups)),
        90,
        what=f"heartbeats of {sorted(groups)}",
    )

    start = await topic_end_offsets(topics.RESULTS)
    n = 600
    rows = arithmetic_items(n, prefix="hx")
    dataset = write_jsonl(tmp_path / "hosts.jsonl", rows)
    name = unique("hosts")
    summary = await asyncio.to_thread(
        submit_wait, dataset, "--model", "null", "--shard-size", "10", "--name", name
    )
    run_id = summary["run_id"]
    assert summary["status"] == "completed" and summary["total"] == n, summary

    # Exactly one result per item: in PostgreSQL and in what `evalctl results` hands out.
    ids = [r["id"] for r in rows]
    stored = [r["item_id"] for r in await result_rows(pg, run_id)]
    assert sorted(stored) == sorted(ids)
    exported = Counter(r["item_id"] for r in await asyncio.to_thread(results_jsonl, run_id))
    assert exported == Counter(ids)

    # Who served what, from the results on Kafka: only the hosts' workers, every host some.
    served: dict[str, set[str]] = {}
    for _, value, _ in await read_topic_since(topics.RESULTS, start):
        result = decode(value, ShardResult)
        if result.run_id == run_id:
            for item in result.results:
                served.setdefault(item.item_id, set()).add(result.worker_id)
    assert set(served) == set(ids)
    workers = {w for ws in served.values() for w in ws}
    assert workers <= set(host_of), f"items served off the hosts: {workers - set(host_of)}"
    per_host = Counter(host_of[next(iter(ws))] for ws in served.values())
    assert all(per_host[m["name"]] > 0 for m in machines), per_host
    assert sum(per_host.values()) == n
