"""Idempotent writes of item results and dead letters to PostgreSQL.

The natural key (run_id, item_id) makes every write safe to repeat: a redelivered result
changes nothing, a success replaces a recorded failure (after a redrive), and nothing ever
replaces a success.
"""

from __future__ import annotations

import contextlib
import json
import operator
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec

from evalstream.aggregator.objects import SEGMENT_ROWS
from evalstream.common.analysis.reports import summarise
from evalstream.common.messages import ItemResult
from evalstream.common.names import is_plain_name
from evalstream.common.results import RESULT_COLUMNS, ResultRow, pg_type

# A window's rows reach item_results through a temporary table of the session's own: COPY in
# binary (asyncpg encodes each value once; an array parameter per column costs it an ABC check
# per element, 4x the client CPU), then one set-based statement per outcome that empties the
# staging table as it reads it, so nothing lingers whatever the transaction does next.
_INTERNAL = ("ordinal", "source")
STAGED_COLUMNS = (*RESULT_COLUMNS, *_INTERNAL)
STAGING = "staged_item_results"
_STAGED = ", ".join(STAGED_COLUMNS)
CREATE_STAGING = (
    f"CREATE TEMP TABLE IF NOT EXISTS {STAGING} ON COMMIT DELETE ROWS AS"
    f" SELECT {_STAGED} FROM item_results WITH NO DATA"
)
_UPDATES = ", ".join(f"{c} = EXCLUDED.{c}" for c in (*RESULT_COLUMNS[2:], "source")) + ", recorded_at = now()"


def _insert_staged(where: str) -> str:
    # A staged row's ordinal is its place among the window's rows of its run; the run's block
    # of ordinals, allocated under the write lock ($1 runs, $2 bases), makes it the run's.
    values = ", ".join(
        "staged.ordinal + block.base" if c == "ordinal" else f"staged.{c}" for c in STAGED_COLUMNS
    )
    return (
        f"WITH staged AS (DELETE FROM {STAGING} WHERE {where} RETURNING {_STAGED}) "
        f"INSERT INTO item_results ({_STAGED}) SELECT {values} FROM staged"
        " JOIN unnest($1::text[], $2::int8[]) AS block(run_id, base) ON block.run_id = staged.run_id "
    )


# `xmax = 0` tells a fresh insert from an update: only inserts add to a run's count. An
# update keeps the row's ordinal (its Parquet segment) and takes the new record as source.
UPSERT_SUCCESS = (
    _insert_staged("error IS NULL") + f"ON CONFLICT (run_id, item_id) DO UPDATE SET {_UPDATES} "
    "WHERE item_results.error IS NOT NULL AND EXCLUDED.error IS NULL "
    "RETURNING run_id, item_id, (xmax = 0) AS inserted, ordinal"
)
INSERT_FAILURE = (
    _insert_staged("error IS NOT NULL")
    + "ON CONFLICT (run_id, item_id) DO NOTHING RETURNING run_id, item_id, true AS inserted, ordinal"
)
# A block of ordinals per run, one per row the window may add. A block that would straddle
# the end of the run's open Parquet segment ($3 rows each, objects.py) starts the next one
# instead: a window's rows then share no segment with an earlier window's, which would be read
# back from the database and encoded again (a fast run's windows hold thousands of rows). The
# open segment keeps its gap, as it keeps those of rows a window did not add (redeliveries).
# Computed from the row being updated, so concurrent writers could not share a block.
_OPEN = "runs.next_ordinal % $3"
ALLOCATE_ORDINALS = (
    "UPDATE runs SET next_ordinal = runs.next_ordinal + v.n"
    f" + CASE WHEN {_OPEN} > 0 AND $3 - {_OPEN} < v.n THEN $3 - {_OPEN} ELSE 0 END"
    " FROM unnest($1::text[], $2::int8[]) AS v(run_id, n) WHERE runs.run_id = v.run_id"
    " RETURNING runs.run_id, runs.next_ordinal - v.n AS base"
)
SELECT_ROWS = (
    f"SELECT {', '.join((*RESULT_COLUMNS, *_INTERNAL))} FROM item_results"
    " WHERE (run_id, item_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
)
# An item whose row holds an answer (a regrade grades it again; the others stay failures):
# regrade.answered in SQL.
ANSWERED = "error IS NULL AND response IS NOT NULL"
STREAM_ROWS = 2048  # rows fetched at a time by streamed_rows

SELECT_SEGMENT = (
    f"SELECT {', '.join(RESULT_COLUMNS)} FROM item_results"
    " WHERE run_id = $1 AND ordinal >= $2 AND ordinal < $3 ORDER BY ordinal"
)


# Rows by spans of ordinals: a window mirrors the rows it wrote itself from memory and reads
# only the rest of each segment it rewrites (sink.py).
SELECT_SPANS = (
    f"SELECT i.ordinal, {', '.join('i.' + c for c in RESULT_COLUMNS)}"
    " FROM unnest($2::int8[], $3::int8[]) AS span(lo, hi)"
    " JOIN item_results i ON i.run_id = $1 AND i.ordinal >= span.lo AND i.ordinal < span.hi"
)


def _staged_record(row: Sourced, ordinal: int) -> tuple[Any, ...]:
    """A row as COPY sends it, in STAGED_COLUMNS' order."""
    return (*row_values(row.result), ordinal, row.source)


_result_values = operator.attrgetter(*RESULT_COLUMNS)
_TEXT_AT = [i for i, c in enumerate(RESULT_COLUMNS) if pg_type(c) == "text"]
_text_values = operator.itemgetter(*_TEXT_AT)


def row_values(result: ItemResult) -> tuple[Any, ...]:
    """A result's values in RESULT_COLUMNS' order, as its row holds them (a Sourced result
    holds no NUL)."""
    values: tuple[Any, ...] = _result_values(result)
    return values


_stored_values = operator.itemgetter(*RESULT_COLUMNS)


def stored_values(record: asyncpg.Record) -> ResultRow:
    """A database row's result values, by name (the queries select more columns than them)."""
    values: ResultRow = _stored_values(record)
    return values


def storable_result(result: ItemResult) -> ItemResult:
    """`result` with every NUL of its stored strings replaced. PostgreSQL text cannot hold
    one, and a model may well emit one: refusing the batch would redeliver it for ever. (One
    joined string per result is checked for it: this runs for every result of every window.)"""
    if "\x00" not in "".join(filter(None, _text_values(_result_values(result)))):
        return result
    changed = {c: storable(getattr(result, c)) for c in RESULT_COLUMNS if isinstance(getattr(result, c), str)}
    return msgspec.structs.replace(result, **changed)


def storable(value: Any) -> Any:
    """`value`, with any NUL character of a string replaced (PostgreSQL text cannot hold one)."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value


def _one_per_item(rows: Iterable[Sourced]) -> list[Sourced]:
    """A window may hold a result and its redelivered copy; one statement must not touch a
    row twice, so keep one per item (a success over a failure, else the first record)."""
    best: dict[tuple[str, str], Sourced] = {}
    for r in rows:
        key = r.key
        if key not in best or (best[key].result.error is not None and r.result.error is None):
            best[key] = r
    return list(best.values())


def source_of(topic: str, partition: int, offset: int) -> str:
    """A Kafka record's coordinates as item_results.source holds them."""
    return f"{topic}:{partition}:{offset}"


def coordinates(source: str) -> tuple[str, int, int]:
    topic, partition, offset = source.rsplit(":", 2)
    return topic, int(partition), int(offset)


@dataclass(frozen=True)
class Sourced:
    """A result with the Kafka record that carried it ("topic:partition:offset")."""

    result: ItemResult
    source: str

    def __post_init__(self) -> None:
        # cleaned where results enter the sink: a row's key is the key it is stored under
        object.__setattr__(self, "result", storable_result(self.result))

    @property
    def key(self) -> tuple[str, str]:
        return (self.result.run_id, self.result.item_id)


@dataclass(frozen=True)
class Written:
    """A row a write made (new, or a success that replaced the item's recorded failure): its
    ordinal, and the result and record it holds now."""

    inserted: bool
    ordinal: int
    row: Sourced


@dataclass(frozen=True)
class Staged:
    """A window's rows in the staging table (ResultStore.stage), one per item, by key; how
    many of each run's; whether any succeeded, any failed."""

    rows: dict[tuple[str, str], Sourced]
    per_run: dict[str, int]
    successes: bool
    failures: bool


@dataclass(frozen=True)
class DeadLetterRecord:
    run_id: str | None
    item_id: str | None
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    dlq_partition: int
    dlq_offset: int
    dlq_timestamp: int  # the record's, in ms: with partition and offset, it names the record
    error: str | None
    headers: dict[str, str]
    payload: bytes


@dataclass(frozen=True)
class RunMeta:
    """What the Delta Lake table repeats of a run on each of its rows (delta.py)."""

    model: str
    manifest_sha256: str | None
    dataset_sha256: str | None


class ResultStore:
    CREATED_CACHE_SIZE = 10_000  # runs whose creation time is kept (it never changes)

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._created: dict[str, float] = {}

    async def known_runs(self, run_ids: Iterable[str]) -> set[str]:
        """Those of `run_ids` that are runs (an id that is no plain name never is: names.py,
        and it never reaches the database, which would refuse a NUL in it)."""
        plain = [r for r in set(run_ids) if is_plain_name(r)]
        if not plain:
            return set()
        rows = await self.pool.fetch("SELECT run_id FROM runs WHERE run_id = ANY($1::text[])", plain)
        return {r["run_id"] for r in rows}

    async def write(
        self,
        conn: asyncpg.Connection,
        results: Sequence[Sourced],
        dead_letters: Sequence[DeadLetterRecord] = (),
    ) -> dict[tuple[str, str], Written]:
        """Writes in `conn`'s transaction (the caller commits: all of it is durable before any
        offset is committed). Returns the rows it wrote, by (run_id, item_id); a redelivered
        duplicate is not among them."""
        return await self.apply(conn, await self.stage(conn, results), dead_letters)

    async def stage(self, conn: asyncpg.Connection, results: Sequence[Sourced]) -> Staged:
        """The first half of `write`, in `conn`'s transaction: the results into the session's
        staging table. It touches no shared row, so the sink does it before it takes the
        write lock (sink.py)."""
        # One row per item (a success over a failure), in run order, so that each run's new
        # rows get consecutive ordinals.
        rows = sorted(_one_per_item(results), key=lambda r: r.key)
        per_run: dict[str, int] = {}
        records = []
        for r in rows:
            place = per_run.get(r.result.run_id, 0)
            per_run[r.result.run_id] = place + 1
            records.append(_staged_record(r, place))
        if records:
            await conn.execute(CREATE_STAGING)
            await conn.copy_records_to_table(STAGING, records=records, columns=STAGED_COLUMNS)
        successes = any(r.result.error is None for r in rows)
        return Staged(
            {r.key: r for r in rows}, per_run, successes, any(r.result.error is not None for r in rows)
        )

    async def apply(
        self, conn: asyncpg.Connection, staged: Staged, dead_letters: Sequence[DeadLetterRecord] = ()
    ) -> dict[tuple[str, str], Written]:
        """The second half of `write`, in the transaction `stage` began: the staged rows into
        item_results, under the run's next block of ordinals, and the runs' counts."""
        if dead_letters:
            await conn.executemany(
                "INSERT INTO dead_letters (run_id, item_id, original_topic, original_partition, original_offset,"
                " dlq_partition, dlq_offset, dlq_timestamp, error, headers, payload)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)"
                " ON CONFLICT (dlq_partition, dlq_offset, dlq_timestamp) DO NOTHING",
                [
                    (
                        storable(d.run_id),
                        storable(d.item_id),
                        storable(d.original_topic),
                        d.original_partition,
                        d.original_offset,
                        d.dlq_partition,
                        d.dlq_offset,
                        d.dlq_timestamp,
                        storable(d.error),
                        json.dumps(d.headers),
                        d.payload,
                    )
                    for d in dead_letters
                ],
            )
        if not staged.rows:
            return {}
        runs, counts = list(staged.per_run), list(staged.per_run.values())
        blocks = {
            rec["run_id"]: rec["base"]
            for rec in await conn.fetch(ALLOCATE_ORDINALS, runs, counts, SEGMENT_ROWS)
        }
        bases = [blocks[r] for r in runs]
        added: dict[str, int] = {}
        written: dict[tuple[str, str], Written] = {}
        for sql, any_rows in ((UPSERT_SUCCESS, staged.successes), (INSERT_FAILURE, staged.failures)):
            for rec in await conn.fetch(sql, runs, bases) if any_rows else ():
                added[rec["run_id"]] = added.get(rec["run_id"], 0) + int(rec["inserted"])
                key = (rec["run_id"], rec["item_id"])
                written[key] = Written(rec["inserted"], rec["ordinal"], staged.rows[key])
        if any(added.values()):
            await conn.executemany(
                "UPDATE runs SET recorded = recorded + $2, updated_at = now() WHERE run_id = $1",
                [(run_id, n) for run_id, n in sorted(added.items()) if n],
            )
        return written

    async def stored_rows(
        self, conn: asyncpg.Connection, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], asyncpg.Record]:
        """The current rows (with ordinal and source) of the given items."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        rows = await conn.fetch(SELECT_ROWS, [k[0] for k in wanted], [k[1] for k in wanted])
        return {(r["run_id"], r["item_id"]): r for r in rows}

    async def segment_rows(
        self, conn: asyncpg.Connection | asyncpg.Pool, run_id: str, first: int, end: int
    ) -> list[asyncpg.Record]:
        """The run's rows with ordinals in [first, end), in ordinal order."""
        return list(await conn.fetch(SELECT_SEGMENT, run_id, first, end))

    async def rows_between(
        self, conn: asyncpg.Connection | asyncpg.Pool, run_id: str, spans: Sequence[tuple[int, int]]
    ) -> list[asyncpg.Record]:
        """The run's rows (with their ordinals) whose ordinals fall in any of the [first, end)
        `spans`."""
        if not spans:
            return []
        return list(await conn.fetch(SELECT_SPANS, run_id, [s[0] for s in spans], [s[1] for s in spans]))

    async def run_meta(self, run_ids: Sequence[str]) -> dict[str, RunMeta]:
        rows = await self.pool.fetch(
            "SELECT run_id, model, manifest_sha256, dataset_sha256 FROM runs WHERE run_id = ANY($1::text[])",
            list(run_ids),
        )
        return {r["run_id"]: RunMeta(r["model"], r["manifest_sha256"], r["dataset_sha256"]) for r in rows}

    async def recorded(self, conn: asyncpg.Connection, run_ids: Sequence[str]) -> dict[str, int]:
        """Each run's count of rows, as `conn` sees it (inside a window's transaction: with
        its own rows)."""
        rows = await conn.fetch(
            "SELECT run_id, recorded FROM runs WHERE run_id = ANY($1::text[])", list(run_ids)
        )
        return {r["run_id"]: r["recorded"] for r in rows}

    async def progress(self, run_id: str) -> tuple[str, int | None, int]:
        """(status, total, results so far)."""
        row = await self.pool.fetchrow("SELECT status, total, recorded FROM runs WHERE run_id = $1", run_id)
        assert row is not None
        return row["status"], row["total"], row["recorded"]

    async def runs_created(self, run_ids: set[str]) -> dict[str, float]:
        """Unix creation time of each run (cached, bounded: it never changes)."""
        missing = [r for r in run_ids if r not in self._created]
        if missing:
            rows = await self.pool.fetch(
                "SELECT run_id, extract(epoch FROM created_at)::float8 AS t FROM runs"
                " WHERE run_id = ANY($1::text[])",
                missing,
            )
            self._created.update({r["run_id"]: r["t"] for r in rows})
            while len(self._created) > self.CREATED_CACHE_SIZE:
                self._created.pop(next(iter(self._created)))
        return {r: self._created[r] for r in run_ids if r in self._created}

    async def complete(self, run_id: str) -> tuple[bool, dict[str, Any]]:
        """Marks the run completed and stores its summary, in one transaction. Returns
        (whether this call completed it, the summary): of the handlers that race to
        complete a run, one gets True."""
        async with self.pool.acquire() as conn, conn.transaction():
            first = await conn.fetchval(
                "UPDATE runs SET status = 'completed', completed_at = now(), updated_at = now()"
                " WHERE run_id = $1 AND status <> 'completed' RETURNING true",
                run_id,
            )
            summary = await summarise(conn, run_id)
            await conn.execute(
                "UPDATE runs SET summary = $2 WHERE run_id = $1",
                run_id,
                msgspec.json.encode(summary).decode(),
            )
        return bool(first), summary

    async def dead_letters_to_redrive(self, run_id: str) -> list[tuple[int, bytes]]:
        """(id, payload) of the run's dead letters not yet redriven, oldest first."""
        rows = await self.pool.fetch(
            "SELECT id, payload FROM dead_letters WHERE run_id = $1 AND redriven_at IS NULL ORDER BY id",
            run_id,
        )
        return [(r["id"], bytes(r["payload"])) for r in rows]

    async def mark_redriven(self, ids: list[int]) -> None:
        await self.pool.execute(
            "UPDATE dead_letters SET redriven_at = now() WHERE id = ANY($1::bigint[])", ids
        )

    # --- regrades (regrade.py): the original run, and the new run's rows in `runs`

    async def run_row(self, run_id: str) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(
            "SELECT run_id, name, status, model, spec, manifest, manifest_sha256, dataset_uri, dataset_sha256,"
            " total, shard_count FROM runs WHERE run_id = $1",
            run_id,
        )
        return dict(row) if row is not None else None

    async def run_state(self, run_id: str) -> tuple[str, str | None] | None:
        """(status, the run it regrades) of `run_id`, or None if there is no such run."""
        row = await self.pool.fetchrow(
            "SELECT status, spec->>'regrade_of' AS regrade_of FROM runs WHERE run_id = $1", run_id
        )
        return (row["status"], row["regrade_of"]) if row is not None else None

    @contextlib.asynccontextmanager
    async def snapshot(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection in a read-only transaction that sees one state of every table
        (repeatable read): the passes of a regrade agree with each other."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            yield conn

    @staticmethod
    async def streamed_rows(
        conn: asyncpg.Connection,
        run_id: str,
        columns: Sequence[str],
        *,
        answered: bool,
        order: str = "item_id",
    ) -> AsyncIterator[asyncpg.Record]:
        """`columns` of the run's rows that hold an answer (or, `answered=False`, those that
        do not), from a cursor in `conn`'s transaction: a big run's rows are never all in
        memory. Columns and order are ours, never a caller's input."""
        which = ANSWERED if answered else f"NOT ({ANSWERED})"
        sql = f"SELECT {', '.join(columns)} FROM item_results WHERE run_id = $1 AND {which} ORDER BY {order}"
        async for row in conn.cursor(sql, run_id, prefetch=STREAM_ROWS):
            yield row

    async def create_regrade_run(
        self,
        run_id: str,
        original: dict[str, Any],
        *,
        name: str,
        grader: str,
        spec: dict[str, Any],
        manifest: dict[str, Any],
        digest: str,
    ) -> None:
        """The new run, `publishing` until its shards are on the broker (kept as it is when
        it exists: a redelivered request)."""
        await self.pool.execute(
            "INSERT INTO runs (run_id, name, status, model, grader, spec, manifest, manifest_sha256, dataset_uri,"
            " dataset_sha256, total, shard_count, published_at)"
            " VALUES ($1, $2, 'publishing', $3, $4, $5, $6, $7, $8, $9, $10, $11, now())"
            " ON CONFLICT (run_id) DO NOTHING",
            run_id,
            name,
            original["model"],
            grader,
            json.dumps(spec),
            json.dumps(manifest),
            digest,
            original["dataset_uri"],
            original["dataset_sha256"],
            original["total"],
            original["shard_count"],
        )

    async def mark_published(self, run_id: str) -> None:
        await self.pool.execute(
            "UPDATE runs SET status = 'running', updated_at = now() WHERE run_id = $1 AND status = 'publishing'",
            run_id,
        )

    async def reject_regrade(
        self, run_id: str, original: str, grader: str, problems: list[dict[str, Any]]
    ) -> None:
        await self.pool.execute(
            "INSERT INTO runs (run_id, status, model, grader, spec, problems)"
            " VALUES ($1, 'rejected', '', $2, $3, $4) ON CONFLICT (run_id) DO NOTHING",
            run_id,
            grader,
            json.dumps({"regrade_of": original, "grader": grader, "run_id": run_id}),
            json.dumps(problems),
        )
