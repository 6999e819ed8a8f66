"""The aggregator's results sink on the real PostgreSQL and S3 store: each Kafka record's
rows reach PostgreSQL, the Parquet segments and the Delta table exactly once, whatever is
redone after a crash, redelivered later, or written by two aggregators at once (a partition
that moved in a rebalance while its old owner still worked on it).

Each test has a Delta table of its own (tables/test-<id>) and runs of its own; the sink is the
aggregator's own code (sink.ResultSink), with a SinkLock per simulated aggregator process."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from evalstream.aggregator import delta, objects
from evalstream.aggregator.completion import Completion
from evalstream.aggregator.sink import ResultSink, SinkLock, Window
from evalstream.aggregator.store import ResultStore, Sourced, source_of
from evalstream.common import db, storage
from evalstream.common.messages import ItemResult
from evalstream.common.results import RESULT_COLUMNS
from evalstream.common.settings import Settings
from evalstream.common.testhooks import CrashPoints
from tests.support import principal_settings, unique, wait_until

pytestmark = pytest.mark.stack


@dataclass
class Aggregator:
    """One simulated aggregator process: its pool, its lock session, its sink."""

    pool: asyncpg.Pool
    lock: SinkLock
    store: ResultStore
    sink: ResultSink


@pytest.fixture
async def table_uri(stack: Settings) -> str:
    return f"s3://{stack.s3_bucket_results}/tables/{unique('test-sink')}"


@pytest.fixture
async def aggregators(stack: Settings, table_uri: str) -> AsyncIterator[list[Aggregator]]:
    made: list[Aggregator] = []
    own = principal_settings("aggregator")  # the aggregator's database role and S3 key pair
    for _ in range(2):
        pool = await db.create_pool(own.database_url, max_size=4)
        store = ResultStore(pool)
        s3 = storage.client(own)
        table = delta.DeltaMirror(delta.DeltaResults(table_uri, delta.storage_options(own)), store)
        lock = SinkLock(own.database_url)
        sink = ResultSink(
            pool,
            lock,
            store,
            s3,
            stack.s3_bucket_results,
            table,
            Completion(store, s3, stack.s3_bucket_results),
            CrashPoints(""),
        )
        made.append(Aggregator(pool, lock, store, sink))
    yield made
    for a in made:
        await a.lock.close()
        await a.pool.close()


async def new_run(pg: asyncpg.Connection, total: int) -> str:
    run_id = unique("run-sink")
    await pg.execute(
        "INSERT INTO runs (run_id, status, model, grader, spec, total, manifest_sha256)"
        " VALUES ($1, 'running', 'null', 'exact', $2, $3, 'm')",
        run_id,
        json.dumps({}),
        total,
    )
    return run_id


def result(run_id: str, item_id: str, error: str | None = None) -> ItemResult:
    return ItemResult(
        run_id=run_id, item_id=item_id, shard_id=f"{run_id}-s0", response=None if error else f"answer {item_id}",
        extracted=None if error else item_id, correct=None if error else True, score=0.0 if error else 1.0,
        error=error,
    )  # fmt: skip


def window(
    run_id: str, topic: str, partition: int, records: dict[int, list[str]], error: str | None = None
) -> Window:
    """Records at `offset` carrying the items listed."""
    return Window(
        [
            Sourced(result(run_id, item, error), source_of(topic, partition, offset))
            for offset, items in records.items()
            for item in items
        ]
    )


def delta_items(stack: Settings, uri: str, run_id: str) -> Counter[tuple[str, bool]]:
    table = DeltaTable(uri, storage_options=delta.storage_options(stack)).to_pyarrow_table()
    return Counter(
        (item, error is None)
        for r, item, error in zip(
            table.column("run_id").to_pylist(),
            table.column("item_id").to_pylist(),
            table.column("error").to_pylist(),
            strict=True,
        )
        if r == run_id
    )


def delta_version(stack: Settings, uri: str) -> int:
    return DeltaTable(uri, storage_options=delta.storage_options(stack)).version()


def parquet_items(stack: Settings, run_id: str) -> Counter[tuple[str, bool]]:
    s3 = storage.client(stack)
    out: Counter[tuple[str, bool]] = Counter()
    for obj in s3.list_objects(stack.s3_bucket_results, prefix=f"runs/{run_id}/results/", recursive=True):
        table = pq.read_table(io.BytesIO(storage.get_bytes(s3, stack.s3_bucket_results, obj.object_name)))
        items, errors = table.column("item_id").to_pylist(), table.column("error").to_pylist()
        out.update((i, e is None) for i, e in zip(items, errors, strict=True))
    return out


async def pg_items(pg: asyncpg.Connection, run_id: str) -> Counter[tuple[str, bool]]:
    rows = await pg.fetch("SELECT item_id, error IS NULL AS ok FROM item_results WHERE run_id = $1", run_id)
    return Counter((r["item_id"], r["ok"]) for r in rows)


def spy_on_commits(a: Aggregator) -> list[tuple[int, int]]:
    """(rows appended, rows merged) of each Delta commit the sink asks for from now on."""
    sent: list[tuple[int, int]] = []
    results = a.sink.delta.results
    commit = results.commit

    def spy(appended, merged, meta, transactions):
        sent.append((len(appended), len(merged)))
        return commit(appended, merged, meta, transactions)

    results.commit = spy  # type: ignore[method-assign]
    return sent


async def test_each_record_reaches_every_sink_once_through_crashes_and_redeliveries(
    stack: Settings, pg_admin: asyncpg.Connection, aggregators: list[Aggregator], table_uri: str
) -> None:
    a = aggregators[0]
    run_id = await new_run(pg_admin, total=4)
    w1 = window(run_id, "eval.results", 0, {10: ["1", "2"], 11: ["3"]})

    # killed after its database commit, before the mirror: the rows are in PostgreSQL only
    async with a.pool.acquire() as conn, conn.transaction():
        assert len(await a.store.write(conn, w1.results)) == 3
    assert parquet_items(stack, run_id) == Counter()
    # redelivered: the write adds nothing, yet S3 and Delta get the rows, found by their source
    recorded = await a.sink.record(w1)
    assert recorded.results == []  # no row is new: the metrics count nothing twice
    assert delta_items(stack, table_uri, run_id) == Counter({("1", True): 1, ("2", True): 1, ("3", True): 1})
    assert parquet_items(stack, run_id) == await pg_items(pg_admin, run_id)

    # killed after the Delta commit, before the Kafka commit: redelivered, nothing at all happens
    # (the table's transaction ids say the records are in: not even a merge is tried)
    version = delta_version(stack, table_uri)
    sent = spy_on_commits(a)
    await a.sink.record(w1)
    assert delta_version(stack, table_uri) == version and sent == [(0, 0)]

    # a result delivered again later (a worker redelivery), at a new offset: no effect anywhere
    await a.sink.record(window(run_id, "eval.results", 0, {12: ["3"]}))
    assert delta_version(stack, table_uri) == version

    # item 4 dead-lettered, then redriven to a success: one row, the success
    await a.sink.record(window(run_id, "eval.dlq", 1, {5: ["4"]}, error="failed 3 times"))
    assert delta_items(stack, table_uri, run_id)[("4", False)] == 1
    assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "completed"
    await a.sink.record(window(run_id, "eval.results", 0, {13: ["4"]}))
    expected = Counter({("1", True): 1, ("2", True): 1, ("3", True): 1, ("4", True): 1})
    assert await pg_items(pg_admin, run_id) == expected
    assert delta_items(stack, table_uri, run_id) == expected
    assert parquet_items(stack, run_id) == expected
    assert await pg_admin.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) == 4


async def test_two_aggregators_writing_the_same_records_at_once_add_each_row_once(
    stack: Settings, pg_admin: asyncpg.Connection, aggregators: list[Aggregator], table_uri: str
) -> None:
    """A partition moved in a rebalance while its old owner still worked on its window: both
    write the same records, the new owner a longer window."""
    run_id = await new_run(pg_admin, total=75)
    old = window(run_id, "eval.results", 1, {o: [f"{o}-{i}" for i in range(5)] for o in range(10)})
    new = window(run_id, "eval.results", 1, {o: [f"{o}-{i}" for i in range(5)] for o in range(15)})
    await asyncio.gather(aggregators[0].sink.record(old), aggregators[1].sink.record(new))
    expected = Counter({(f"{o}-{i}", True): 1 for o in range(15) for i in range(5)})
    assert await pg_items(pg_admin, run_id) == expected
    assert delta_items(stack, table_uri, run_id) == expected
    assert parquet_items(stack, run_id) == expected
    assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "completed"


async def test_segments_hold_a_runs_rows_by_the_order_they_were_recorded(
    stack: Settings,
    pg_admin: asyncpg.Connection,
    aggregators: list[Aggregator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A window whose rows would straddle the end of the run's open segment starts the next
    one, so it reads back none of another window's rows; a window that fits in the open
    segment shares it, and the segment is rewritten with the earlier rows read back."""
    read_back: list[int] = []
    rows_between = ResultStore.rows_between

    async def counted(self: ResultStore, *args: Any) -> list[asyncpg.Record]:
        rows = await rows_between(self, *args)
        read_back.append(len(rows))
        return rows

    monkeypatch.setattr(ResultStore, "rows_between", counted)
    half = objects.SEGMENT_ROWS // 2 + 5
    run_id = await new_run(pg_admin, total=2 * half + 10)
    items = [f"{i:06d}" for i in range(2 * half + 10)]
    first, second, third = items[:half], items[half : 2 * half], items[2 * half :]
    await aggregators[0].sink.record(window(run_id, "eval.results", 2, {0: first}))
    await aggregators[1].sink.record(window(run_id, "eval.results", 3, {0: second}))
    assert sum(read_back) == 0  # the second window's rows did not fit in segment 0: segment 1
    await aggregators[0].sink.record(window(run_id, "eval.results", 2, {1: third}))
    assert sum(read_back) == half  # the third fits in segment 1: the second's rows read back

    s3 = storage.client(stack)
    names = sorted(
        o.object_name
        for o in s3.list_objects(stack.s3_bucket_results, prefix=f"runs/{run_id}/results/", recursive=True)
    )
    assert names == [
        f"runs/{run_id}/results/part-000000.parquet",
        f"runs/{run_id}/results/part-000001.parquet",
    ]
    segments = [
        pq.read_table(io.BytesIO(storage.get_bytes(s3, stack.s3_bucket_results, name)))
        .column("item_id")
        .to_pylist()
        for name in names
    ]
    assert segments == [first, second + third]
    assert parquet_items(stack, run_id) == await pg_items(pg_admin, run_id)
    ordinals = await pg_admin.fetch(
        "SELECT item_id, ordinal FROM item_results WHERE run_id = $1 ORDER BY ordinal", run_id
    )
    assert [r["item_id"] for r in ordinals] == items
    assert ordinals[half]["ordinal"] == objects.SEGMENT_ROWS  # the gap: segment 0's unused end


async def test_segments_are_the_database_rows_column_for_column_whichever_window_wrote_them(
    stack: Settings, pg_admin: asyncpg.Connection, aggregators: list[Aggregator], table_uri: str
) -> None:
    """A window mirrors its own rows from memory and reads the rest of each segment: the
    segment still equals the database, whoever wrote which row, after failures replaced by
    successes at scattered ordinals (few: read around them; many: the segment read whole),
    with NULs the database cannot store (in an answer, in an item id), and with a failure
    and a success of one item in one window (the success is the row, everywhere)."""
    run_id = await new_run(pg_admin, total=100)

    def item(i: int, *, retried: bool = False) -> ItemResult:
        failed = i % 3 == 0 and not retried
        r = result(run_id, "09\x009" if i == 99 else f"{i:03d}", error="timed out" if failed else None)
        return msgspec.structs.replace(r, response="nul \x00 here", latency_ms=2.5) if i == 5 else r

    def sourced(items: list[ItemResult], offset: int) -> Window:
        return Window([Sourced(r, source_of("eval.results", 4, offset)) for r in items])

    async def segment_is_the_database() -> None:
        s3 = storage.client(stack)
        name = f"runs/{run_id}/results/part-000000.parquet"
        stored = pq.read_table(io.BytesIO(storage.get_bytes(s3, stack.s3_bucket_results, name))).to_pylist()
        rows = await pg_admin.fetch(
            f"SELECT {', '.join(RESULT_COLUMNS)} FROM item_results WHERE run_id = $1 ORDER BY ordinal", run_id
        )
        assert stored == [dict(r) for r in rows]

    first, second = aggregators
    # item 1 timed out on one delivery and was answered on another, both in this window
    timed_out = Sourced(result(run_id, "001", error="timed out"), source_of("eval.results", 4, 0))
    both = sourced([item(i) for i in range(60)], 1)
    await first.sink.record(Window([timed_out, *both.results]))
    await segment_is_the_database()
    assert delta_items(stack, table_uri, run_id)[("001", True)] == 1
    await second.sink.record(sourced([item(i) for i in range(60, 100)], 2))
    await segment_is_the_database()
    await first.sink.record(sourced([item(0, retried=True), item(30, retried=True)], 3))  # 2 spans read
    await segment_is_the_database()
    retried = [item(i, retried=True) for i in range(3, 100, 3) if i != 30]  # 33 spans: read whole
    await second.sink.record(sourced(retried, 4))
    await segment_is_the_database()
    assert (
        await pg_admin.fetchval(
            "SELECT count(*) FROM item_results WHERE run_id = $1 AND error IS NULL", run_id
        )
        == 100
    )
    assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "completed"
    nul = await pg_admin.fetchval(
        "SELECT response FROM item_results WHERE run_id = $1 AND item_id = '005'", run_id
    )
    assert nul == "nul \ufffd here"
    assert (
        await pg_admin.fetchval(
            "SELECT count(*) FROM item_results WHERE run_id = $1 AND item_id = '09\ufffd9'", run_id
        )
        == 1
    )
    expected = Counter({(f"{i:03d}" if i < 99 else "09\ufffd9", True): 1 for i in range(100)})
    assert delta_items(stack, table_uri, run_id) == expected


async def test_a_window_whose_write_fails_holds_no_lock_and_leaves_nothing_behind(
    stack: Settings, pg_admin: asyncpg.Connection, aggregators: list[Aggregator], table_uri: str
) -> None:
    """The rows are staged before the write lock is taken; a failure under the lock rolls the
    transaction back (the staged rows with it) and lets the lock go, so the other aggregator
    writes the window at once, and the failed one can write its next window."""
    first, second = aggregators
    run_id = await new_run(pg_admin, total=6)
    apply = first.store.apply

    async def failing(*args: Any, **kw: Any) -> Any:
        await apply(*args, **kw)  # the rows are in item_results, uncommitted
        raise ConnectionResetError("the database went away")

    first.store.apply = failing  # type: ignore[method-assign]
    w1 = window(run_id, "eval.results", 0, {0: ["1", "2", "3"]})
    with pytest.raises(ConnectionResetError):
        await first.sink.record(w1)
    assert await pg_items(pg_admin, run_id) == Counter()
    await asyncio.wait_for(second.sink.record(w1), 30)  # the write lock is free
    first.store.apply = apply  # type: ignore[method-assign]
    await asyncio.wait_for(first.sink.record(window(run_id, "eval.results", 0, {1: ["4", "5", "6"]})), 30)
    expected = Counter({(str(i), True): 1 for i in range(1, 7)})
    assert await pg_items(pg_admin, run_id) == expected
    assert delta_items(stack, table_uri, run_id) == expected
    assert parquet_items(stack, run_id) == expected
    assert await pg_admin.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) == 6


async def test_a_write_overlaps_another_windows_mirror_and_the_run_completes_once_all_is_mirrored(
    stack: Settings, pg_admin: asyncpg.Connection, aggregators: list[Aggregator], table_uri: str
) -> None:
    """Aggregator 0's Delta commit is held; aggregator 1's window, the run's last rows, commits
    its database write meanwhile (the relay), but the run completes only after both mirrors."""
    first, second = aggregators
    run_id = await new_run(pg_admin, total=6)
    in_commit, release = threading.Event(), threading.Event()
    commit = first.sink.delta.results.commit

    def held_commit(*args: Any) -> Any:
        in_commit.set()
        release.wait(60)
        return commit(*args)

    first.sink.delta.results.commit = held_commit  # type: ignore[method-assign,assignment]
    seen_at_completion: list[Counter[tuple[str, bool]]] = []
    for a in aggregators:
        complete = a.store.complete

        async def watched(run: str, complete: Any = complete) -> Any:
            seen_at_completion.append(delta_items(stack, table_uri, run))
            return await complete(run)

        a.store.complete = watched  # type: ignore[method-assign,assignment]

    mirroring = asyncio.create_task(
        first.sink.record(window(run_id, "eval.results", 0, {0: ["1", "2", "3"]}))
    )
    assert await asyncio.to_thread(in_commit.wait, 30)
    last = asyncio.create_task(second.sink.record(window(run_id, "eval.results", 1, {0: ["4", "5", "6"]})))

    async def all_written() -> bool:
        return await pg_admin.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id) == 6

    await wait_until(all_written, 30, 0.05, "the second window's write, during the first's mirror")
    assert not mirroring.done() and not last.done()  # the second waits for the first's mirror
    assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "running"
    release.set()
    await asyncio.gather(mirroring, last)
    expected = Counter({(str(i), True): 1 for i in range(1, 7)})
    assert await pg_admin.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "completed"
    assert seen_at_completion == [expected]  # completed once, with every row already in Delta
    assert delta_items(stack, table_uri, run_id) == expected
    assert parquet_items(stack, run_id) == expected
