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

from evalstream.common.messages import ItemResult

_COLUMNS = (
    "run_id",
    "item_id",
    "shard_id",
    "response",
    "extracted",
    "correct",
    "score",
    "error",
    "attempts",
    "cache_hit",
    "latency_ms",
    "served_by",
    "model_revision",
    "prompt_tokens",
    "completion_tokens",
    "truncated",
    "category",
)
_VALUES = ", ".join(f"${i + 1}" for i in range(len(_COLUMNS)))
_UPDATES = ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[2:]) + ", recorded_at = now()"

UPSERT_SUCCESS = (
    f"INSERT INTO item_results ({', '.join(_COLUMNS)}) VALUES ({_VALUES}) "
    f"ON CONFLICT (run_id, item_id) DO UPDATE SET {_UPDATES} "
    "WHERE item_results.error IS NOT NULL AND EXCLUDED.error IS NULL"
)
INSERT_FAILURE = f"INSERT INTO item_results ({', '.join(_COLUMNS)}) VALUES ({_VALUES}) ON CONFLICT (run_id, item_id) DO NOTHING"


def _row(r: ItemResult) -> tuple[Any, ...]:
    return tuple(getattr(r, c) for c in _COLUMNS)


@dataclass(frozen=True)
class DeadLetterRecord:
    run_id: str | None
    item_id: str | None
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    dlq_partition: int
    dlq_offset: int
    error: str | None
    headers: dict[str, str]
    payload: bytes


class ResultStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

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
    ) -> None:
        """One transaction: all of it is durable before any offset is committed."""
        async with self.pool.acquire() as conn, conn.transaction():
            if dead_letters:
                await conn.executemany(
                    "INSERT INTO dead_letters (run_id, item_id, original_topic, original_partition, original_offset,"
                    " dlq_partition, dlq_offset, error, headers, payload) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"
                    " ON CONFLICT (dlq_partition, dlq_offset) DO NOTHING",
                    [
                        (
                            d.run_id,
                            d.item_id,
                            d.original_topic,
                            d.original_partition,
                            d.original_offset,
                            d.dlq_partition,
                            d.dlq_offset,
                            d.error,
                            json.dumps(d.headers),
                            d.payload,
                        )
                        for d in dead_letters
                    ],
                )
            if successes:
                await conn.executemany(UPSERT_SUCCESS, [_row(r) for r in successes])
            if failures:
                await conn.executemany(INSERT_FAILURE, [_row(r) for r in failures])

    async def shard_rows(self, run_id: str, shard_id: str) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            f"SELECT {', '.join(_COLUMNS)} FROM item_results WHERE run_id = $1 AND shard_id = $2 ORDER BY item_id",
            run_id,
            shard_id,
        )

    async def progress(self, run_id: str) -> tuple[str, int | None, int]:
        """(status, total, results so far)."""
        row = await self.pool.fetchrow(
            "SELECT status, total, (SELECT count(*) FROM item_results i WHERE i.run_id = r.run_id) AS done"
            " FROM runs r WHERE run_id = $1",
            run_id,
        )
        assert row is not None
        return row["status"], row["total"], row["done"]
