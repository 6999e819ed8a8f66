"""A regrade reads the original run's rows from PostgreSQL a shard at a time (a cursor in one
snapshot, regrade.regrade_run): on the real database, its shards carry every answer once, in
shard order, and the unanswered items become the new run's failures, copied whole."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from evalstream.aggregator import delta, regrade
from evalstream.aggregator.completion import Completion
from evalstream.aggregator.sink import ResultSink, SinkLock, Window
from evalstream.aggregator.store import ResultStore, Sourced, source_of
from evalstream.common import db, storage
from evalstream.common.messages import Item, ItemResult, Regrade, Shard
from evalstream.common.settings import Settings
from evalstream.common.testhooks import CrashPoints
from tests.support import principal_settings, unique

pytestmark = pytest.mark.stack

SHARDS = {"s00000": ["a", "b", "c"], "s00001": ["d", "e"], "s00002": ["f"]}  # f fails: no answer
FAILED = {"c", "f"}


def original_result(run_id: str, shard: str, item: str) -> ItemResult:
    failed = item in FAILED
    return ItemResult(
        run_id=run_id, item_id=item, shard_id=f"{run_id}-{shard}", response=None if failed else f"answer {item}",
        extracted=None, correct=None if failed else item != "b", score=0.0 if failed else 1.0,
        error="engine failed" if failed else None, latency_ms=12.5, prompt=f"prompt {item}", attempts=2,
        served_by="g/replay", question=f"question {item}?", gold=item,
    )  # fmt: skip


async def test_a_regrade_streams_each_shard_of_answers_and_copies_the_failures(
    stack: Settings, pg_admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = principal_settings("aggregator")
    pool = await db.create_pool(own.database_url, max_size=4)
    lock = SinkLock(own.database_url)
    try:
        store = ResultStore(pool)
        s3 = storage.client(own)
        uri = f"s3://{stack.s3_bucket_results}/tables/{unique('test-regrade')}"
        table = delta.DeltaMirror(delta.DeltaResults(uri, delta.storage_options(own)), store)
        completion = Completion(store, s3, stack.s3_bucket_results)
        sink = ResultSink(pool, lock, store, s3, stack.s3_bucket_results, table, completion, CrashPoints(""))
        run_id, new_id = unique("run-rg"), unique("run-rg-new")
        total = sum(len(v) for v in SHARDS.values())
        await pg_admin.execute(
            "INSERT INTO runs (run_id, name, status, model, grader, spec, manifest, manifest_sha256, total)"
            " VALUES ($1, 'o', 'running', 'replay:x', 'exact', $2, $3, 'm', $4)",
            run_id,
            json.dumps({"generation": {"max_tokens": 7}}),
            json.dumps({"grader": {"name": "exact"}, "dataset": {"uri": "s3://x/y"}}),
            total,
        )
        # recorded as the aggregator records them, one record per original shard
        for offset, (shard, ids) in enumerate(SHARDS.items()):
            source = source_of("eval.results", 0, offset)
            await sink.record(Window([Sourced(original_result(run_id, shard, i), source) for i in ids]))
        assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "completed"

        items = {i: Item(id=i, question=f"question {i}?", answer=i) for ids in SHARDS.values() for i in ids}
        # the stored dataset copy and the manifests are other tests' subject (test_regrade.py)
        monkeypatch.setattr(regrade, "request_from_manifest", lambda manifest: manifest)
        monkeypatch.setattr(regrade, "run_items", lambda *_: list(items.values()))
        monkeypatch.setattr(regrade, "regraded_manifest", lambda manifest, *_: manifest)
        published: list[Shard] = []

        async def publish(shards: Any) -> None:
            async for shard in shards:
                published.append(shard)

        request = Regrade(run_id=run_id, new_run_id=new_id, grader="contains")
        await regrade.regrade_run(store, s3, sink, request, source_of("eval.control", 0, 1), publish)

        assert [(s.shard_id, s.shard_index, s.shard_count) for s in published] == [
            (f"{new_id}-s00000", 0, 2),
            (f"{new_id}-s00001", 1, 2),
        ]
        assert [[i.id for i in s.items] for s in published] == [["a", "b"], ["d", "e"]]
        answers = [a for s in published for a in (s.answers or [])]
        assert [(a.item_id, a.response, a.latency_ms, a.attempts, a.prompt) for a in answers] == [
            (i, f"answer {i}", 12.5, 2, f"prompt {i}") for i in ("a", "b", "d", "e")
        ]
        assert all(s.generation.max_tokens == 7 and s.grader == "contains" for s in published)
        copied = await pg_admin.fetch(
            "SELECT item_id, shard_id, error, question, served_by, attempts FROM item_results"
            " WHERE run_id = $1 ORDER BY item_id",
            new_id,
        )
        assert [tuple(r) for r in copied] == [
            ("c", f"{new_id}-s00000", "engine failed", "question c?", "g/replay", 2),
            ("f", f"{new_id}-s00002", "engine failed", "question f?", "g/replay", 2),
        ]
        assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", new_id) == "running"
    finally:
        await lock.close()
        await pool.close()
