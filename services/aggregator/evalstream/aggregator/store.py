"""Idempotent writes of item results and dead letters to PostgreSQL.

The natural key (run_id, item_id) makes every write safe to repeat: a redelivered result
changes nothing, a success replaces a recorded failure (after a redrive), and nothing ever
replaces a success.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec

from evalstream.common.messages import ItemResult
from evalstream.common.reports import summarise
from evalstream.common.results import RESULT_COLUMNS, pg_type

# One statement per batch: every column as an array, unnested server-side.
_UNNEST = ", ".join(f"${i + 1}::{pg_type(c)}[]" for i, c in enumerate(RESULT_COLUMNS))
_UPDATES = ", ".join(f"{c} = EXCLUDED.{c}" for c in RESULT_COLUMNS[2:]) + ", recorded_at = now()"
_INSERT = f"INSERT INTO item_results ({', '.join(RESULT_COLUMNS)}) SELECT * FROM unnest({_UNNEST}) "

# `xmax = 0` tells a fresh insert from an update: only inserts add to a run's count.
UPSERT_SUCCESS = (
    _INSERT + f"ON CONFLICT (run_id, item_id) DO UPDATE SET {_UPDATES} "
    "WHERE item_results.error IS NOT NULL AND EXCLUDED.error IS NULL "
    "RETURNING run_id, item_id, (xmax = 0) AS inserted"
)
INSERT_FAILURE = (
    _INSERT + "ON CONFLICT (run_id, item_id) DO NOTHING RETURNING run_id, item_id, true AS inserted"
)


def _columns(results: Sequence[ItemResult]) -> list[list[Any]]:
    return [[_storable(getattr(r, c)) for r in results] for c in RESULT_COLUMNS]


def _storable(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL; a model may well emit one. Refusing the batch would
    redeliver it for ever, so the character is replaced instead."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value


def _one_per_item(results: Iterable[ItemResult]) -> list[ItemResult]:
    """A batch may hold a result and its redelivered copy; one statement must not touch a
    row twice, so keep one per item (a success over a failure)."""
    best: dict[tuple[str, str], ItemResult] = {}
    for r in results:
        key = (r.run_id, r.item_id)
        if key not in best or (best[key].error is not None and r.error is None):
            best[key] = r
    return list(best.values())


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
        rows = await self.pool.fetch(
            "SELECT run_id FROM runs WHERE run_id = ANY($1::text[])", list(set(run_ids))
        )
        return {r["run_id"] for r in rows}

    async def write(
        self,
        successes: list[ItemResult],
        failures: list[ItemResult],
        dead_letters: Sequence[DeadLetterRecord] = (),
    ) -> dict[tuple[str, str], bool]:
        """One transaction: all of it is durable before any offset is committed. Returns the
        (run_id, item_id) of the rows it wrote, each with whether the row is new (False: a
        success replaced the item's recorded failure); a redelivered duplicate is not among
        them."""
        async with self.pool.acquire() as conn, conn.transaction():
            if dead_letters:
                await conn.executemany(
                    "INSERT INTO dead_letters (run_id, item_id, original_topic, original_partition, original_offset,"
                    " dlq_partition, dlq_offset, dlq_timestamp, error, headers, payload)"
                    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)"
                    " ON CONFLICT (dlq_partition, dlq_offset, dlq_timestamp) DO NOTHING",
                    [
                        (
                            d.run_id,
                            d.item_id,
                            d.original_topic,
                            d.original_partition,
                            d.original_offset,
                            d.dlq_partition,
                            d.dlq_offset,
                            d.dlq_timestamp,
                            d.error,
                            json.dumps(d.headers),
                            d.payload,
                        )
                        for d in dead_letters
                    ],
                )
            added: dict[str, int] = {}
            written: dict[tuple[str, str], bool] = {}
            for sql, rows in (
                (UPSERT_SUCCESS, _one_per_item(successes)),
                (INSERT_FAILURE, _one_per_item(failures)),
            ):
                if rows:
                    for rec in await conn.fetch(sql, *_columns(rows)):
                        added[rec["run_id"]] = added.get(rec["run_id"], 0) + int(rec["inserted"])
                        written[(rec["run_id"], rec["item_id"])] = rec["inserted"]
            if added:
                await conn.executemany(
                    "UPDATE runs SET recorded = recorded + $2, updated_at = now() WHERE run_id = $1",
                    [(run_id, n) for run_id, n in added.items() if n],
                )
        return written

    async def shards_rows(
        self, shards: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], list[asyncpg.Record]]:
        """Every row of the given (run_id, shard_id) shards, in one query, by shard."""
        keys = sorted(set(shards))
        rows = await self.pool.fetch(
            f"SELECT {', '.join(RESULT_COLUMNS)} FROM item_results"
            " WHERE (run_id, shard_id) IN (SELECT * FROM unnest($1::text[], $2::text[])) ORDER BY item_id",
            [k[0] for k in keys],
            [k[1] for k in keys],
        )
        out: dict[tuple[str, str], list[asyncpg.Record]] = {k: [] for k in keys}
        for r in rows:
            out[(r["run_id"], r["shard_id"])].append(r)
        return out

    async def run_meta(self, run_ids: Sequence[str]) -> dict[str, RunMeta]:
        rows = await self.pool.fetch(
            "SELECT run_id, model, manifest_sha256, dataset_sha256 FROM runs WHERE run_id = ANY($1::text[])",
            list(run_ids),
        )
        return {r["run_id"]: RunMeta(r["model"], r["manifest_sha256"], r["dataset_sha256"]) for r in rows}

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

    async def result_rows(self, run_id: str) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(
            f"SELECT {', '.join(RESULT_COLUMNS)} FROM item_results WHERE run_id = $1 ORDER BY item_id", run_id
        )
        return [dict(r) for r in rows]

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
