"""The results sink: one window of Kafka records (results, dead letters or a regrade's copied
failures) into PostgreSQL, the Parquet segments in S3 and the Delta Lake table, then the
completion of every run the window finished, all before the window's offsets are committed.

A window is what one poll of a topic returned (the subscriber's fetch waits for
AGGREGATOR_WINDOW_BYTES or AGGREGATOR_WINDOW_MS, up to AGGREGATOR_WINDOW_RECORDS records), so
a fast stream is written in a few large windows across every run it carries, and a slow run's
results still appear within the time bound.

Several aggregators share the topics' partitions (and so one run's results). A window runs
under SinkLock, two PostgreSQL advisory locks handed over like a relay: `write` across its
database transaction, `mirror` across its mirror (Parquet, then Delta) and its completion
check. A window takes `mirror` before it lets `write` go, so windows mirror in the order their
transactions committed, while the next window's write overlaps this one's mirror:

* the Delta table and each Parquet segment have one writer at a time, and every segment is
  rewritten, in commit order, from the writer's own rows as it committed them and the rest
  read after that commit; a row a later window changed is rewritten by that window's mirror,
  so the last rewrite holds every committed row, and a row's Delta merge follows its append;
* a run is marked completed only by the holder of `mirror`, after its own mirror, and only if
  its count read inside its own transaction (`write` held: no other window's commit is in
  it unmirrored) was the run's total: every row counted was committed by this window or one
  whose mirror finished before this one began, so a completed run's rows are all in S3 and
  Delta, whichever aggregator wrote them.

Crash safety (at-least-once delivery, exactly-once effects): the database write is idempotent
per item; each row records the Kafka record whose result it holds (`source`); the Delta commit
carries, per input partition, the offset after its records (delta.py), so a window redone
after a crash gives Delta exactly the rows of the records it had not committed yet, found in
PostgreSQL by their source when the write itself added nothing the second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from minio import Minio

from evalstream.aggregator import objects
from evalstream.aggregator.completion import Completion, Recorded, written_results
from evalstream.aggregator.delta import DeltaMirror, app_id
from evalstream.aggregator.store import (
    DeadLetterRecord,
    ResultStore,
    Sourced,
    Written,
    coordinates,
    row_values,
    stored_values,
)
from evalstream.common.metrics import SINK_STAGE
from evalstream.common.results import ResultRow
from evalstream.common.testhooks import CrashPoints

log = logging.getLogger("evalstream.aggregator.sink")

WRITE_LOCK_KEY = 0x65767369  # "evsi": one window's database write at a time, across aggregators
MIRROR_LOCK_KEY = 0x6576736D  # "evsm": one window's mirror and completion check at a time
LOCK_TIMEOUT_S = 300  # a holder stuck longer than this is not waited for: the window is retried
SEGMENT_WRITERS = 8  # Parquet segments written at once (S3 round trips overlap)


@dataclass(frozen=True)
class Window:
    """What one poll brought: results, each with the record that carried it, and the rows
    of the dead letters among the records."""

    results: list[Sourced] = field(default_factory=list)
    dead_letters: list[DeadLetterRecord] = field(default_factory=list)


class AdvisoryLock:
    """PostgreSQL's session advisory lock `key` on a connection of its own (a window's
    transaction commits before its mirror, and `mirror` spans the hand-over), plus an asyncio
    lock, since one session's advisory lock is re-entrant for every handler of the process."""

    def __init__(self, dsn: str, key: int) -> None:
        self.dsn = dsn
        self.key = key
        self._local = asyncio.Lock()
        self._conn: asyncpg.Connection | None = None

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(
                self.dsn, server_settings={"lock_timeout": f"{LOCK_TIMEOUT_S}s"}, timeout=30
            )
        return self._conn

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._local:
            conn = await self._connection()
            try:
                await conn.execute("SELECT pg_advisory_lock($1)", self.key)
            except BaseException:
                await self._drop()
                raise
            try:
                yield
            finally:
                try:
                    await conn.execute("SELECT pg_advisory_unlock($1)", self.key)
                except BaseException:
                    await self._drop()  # the session's end releases the lock
                    raise

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
        self._conn = None


class SinkLock:
    """The sink's two locks (module docstring): `write`, then `mirror` taken before `write`
    is let go. Nothing waits for `write` while holding `mirror`, so the two cannot deadlock."""

    def __init__(self, dsn: str) -> None:
        self.write = AdvisoryLock(dsn, WRITE_LOCK_KEY)
        self.mirror = AdvisoryLock(dsn, MIRROR_LOCK_KEY)

    async def close(self) -> None:
        await self.write.close()
        await self.mirror.close()


class timed(contextlib.AbstractContextManager[None]):
    """Observes the time until `close()` (or the `with` block's end) in SINK_STAGE."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.started = time.perf_counter()
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            SINK_STAGE.labels(stage=self.stage).observe(time.perf_counter() - self.started)

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Effects:
    """What a window's mirror must do: Delta rows to append or merge, the transaction
    versions they commit, and the rows the window holds, by run and ordinal (what it wrote,
    or found as its records' rows): the Parquet segments they fall into are rewritten."""

    appended: list[ResultRow] = field(default_factory=list)
    merged: list[ResultRow] = field(default_factory=list)
    transactions: dict[str, int] = field(default_factory=dict)
    rows: dict[str, dict[int, ResultRow]] = field(default_factory=dict)

    def touch(self, run_id: str, ordinal: int, row: ResultRow) -> None:
        self.rows.setdefault(run_id, {})[ordinal] = row

    def segments(self) -> list[tuple[str, int]]:
        """(run, segment) of every segment the window's rows fell into, in order."""
        return sorted({(run_id, objects.segment_of(o)) for run_id, held in self.rows.items() for o in held})


class ResultSink:
    def __init__(
        self,
        pool: asyncpg.Pool,
        lock: SinkLock,
        store: ResultStore,
        s3: Minio,
        bucket: str,
        delta: DeltaMirror,
        completion: Completion,
        crash_points: CrashPoints,
    ) -> None:
        self.pool = pool
        self.lock = lock
        self.store = store
        self.s3 = s3
        self.bucket = bucket
        self.delta = delta
        self.completion = completion
        self.crash_points = crash_points  # test-only (FAULT_INJECT)

    async def record(self, window: Window) -> Recorded:
        """Writes the window, mirrors it, completes the runs it finished; returns what it
        added (rows, not deliveries) for the metrics."""
        runs = sorted({r.result.run_id for r in window.results})
        finished: list[tuple[str, bool, dict[str, Any]]] = []
        async with self.pool.acquire() as conn, contextlib.AsyncExitStack() as mirroring:
            async with contextlib.AsyncExitStack() as writing:
                # The window's rows are staged before the write lock is taken (they touch no
                # shared row), so that the windows of several aggregators overlap that much
                # more; the transaction commits with the lock still held.
                async with conn.transaction():
                    with timed("staging"):
                        staged = await self.store.stage(conn, window.results)
                    waiting = timed("lock_wait")
                    await writing.enter_async_context(self.lock.write.held())
                    waiting.close()
                    database = timed("database")
                    written = await self.store.apply(conn, staged, window.dead_letters)
                    counted = await self.store.recorded(conn, runs)
                database.close()
                handing_over = timed("mirror_wait")
                await mirroring.enter_async_context(self.lock.mirror.held())
                handing_over.close()
            # Counted at once: the rows are durable, and a window redone after its mirror
            # failed (S3 away) writes no row again, so it would count nothing then.
            recorded = written_results([r.result for r in window.results], written)
            await self.completion.observe(recorded)
            self.crash_points.reach("aggregator_exit_after_write")
            await self.mirror(conn, window, written)
            self.crash_points.reach("aggregator_exit_after_delta")
            with timed("completion"):
                for run_id in runs:
                    done = await self.completion.complete_if_done(run_id, counted.get(run_id, 0))
                    if done is not None:
                        finished.append((run_id, *done))
        for run_id, first, summary in finished:
            await self.completion.finish(run_id, first, summary)
            if first:  # the table has one writer at a time: compaction takes `mirror` too
                async with self.lock.mirror.held():
                    await self.delta.compact(run_id)
                    await self.delta.maintain()  # at most once an interval (delta.py)
        return recorded

    async def mirror(self, conn: asyncpg.Connection, window: Window, written: Mapping[Any, Written]) -> None:
        effects = await self.effects(conn, window, written)
        by_segment = effects.segments()
        gate = asyncio.Semaphore(SEGMENT_WRITERS)

        async def rewrite(run_id: str, segment: int) -> None:
            async with gate:
                rows = await self.segment_rows(run_id, segment, effects.rows.get(run_id, {}))
                await asyncio.to_thread(objects.write_segment, self.s3, self.bucket, run_id, segment, rows)

        with timed("parquet"):
            await asyncio.gather(*(rewrite(run_id, k) for run_id, k in by_segment))
        with timed("delta_commit"):
            await self.delta.commit(effects.appended, effects.merged, effects.transactions)

    async def segment_rows(self, run_id: str, segment: int, held: Mapping[int, ResultRow]) -> list[ResultRow]:
        """A segment's rows as the database holds them now: the window's own from memory (as
        committed; a later window that changed one rewrites the segment after this one), the
        rest read. Reading after the window's commit keeps the rewrite up to date (module
        docstring)."""
        first, end = objects.segment_bounds(segment)
        spans = objects.spans_without(first, end, held)
        if spans is None:  # held rows scattered: the whole segment in one read
            return [stored_values(r) for r in await self.store.segment_rows(self.pool, run_id, first, end)]
        rows = {
            r["ordinal"]: stored_values(r) for r in await self.store.rows_between(self.pool, run_id, spans)
        }
        rows.update((o, row) for o, row in held.items() if first <= o < end)
        return [rows[o] for o in sorted(rows)]

    async def effects(
        self, conn: asyncpg.Connection, window: Window, written: Mapping[Any, Written]
    ) -> Effects:
        out = Effects()
        # per record, not per result: a record carries a shard's results
        coords = {source: coordinates(source) for source in {r.source for r in window.results}}
        partitions = sorted({(t, p) for t, p, _ in coords.values()})
        with timed("delta_versions"):
            held = await self.delta.held([app_id(t, p) for t, p in partitions])

        def committed(topic: str, partition: int, offset: int) -> bool:
            version = held[app_id(topic, partition)]
            return version is not None and offset < version

        # the records whose rows Delta has not committed yet
        pending = {source for source, at in coords.items() if not committed(*at)}
        for (run_id, _), w in written.items():
            row = row_values(w.row.result)  # as written: a Sourced result holds no NUL
            out.touch(run_id, w.ordinal, row)
            if w.row.source in pending:
                (out.appended if w.inserted else out.merged).append(row)
        # Items this write did not change, carried by records Delta has not committed: a window
        # redone after a crash finds its rows by their source (else they are duplicates).
        again = {r.key for r in window.results if r.key not in written and r.source in pending}
        if again:
            for (run_id, _), row in (await self.store.stored_rows(conn, again)).items():
                if row["source"] in pending:
                    values = stored_values(row)
                    out.touch(run_id, row["ordinal"], values)
                    out.merged.append(values)
        for source in sorted(pending):
            topic, partition, offset = coords[source]
            key = app_id(topic, partition)
            out.transactions[key] = max(out.transactions.get(key, 0), offset + 1)
        return out
