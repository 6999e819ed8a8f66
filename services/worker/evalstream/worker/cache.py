"""The answer cache, shared by every worker through PostgreSQL."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class CachedAnswer:
    response: str
    prompt_tokens: int
    completion_tokens: int


class AnswerCache:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def get_many(self, keys: list[str]) -> dict[str, CachedAnswer]:
        if not keys:
            return {}
        rows = await self.pool.fetch(
            "SELECT key, response, prompt_tokens, completion_tokens FROM answer_cache WHERE key = ANY($1::text[])",
            keys,
        )
        return {
            r["key"]: CachedAnswer(r["response"], r["prompt_tokens"], r["completion_tokens"]) for r in rows
        }

    async def put_many(self, entries: list[tuple[str, str, CachedAnswer]]) -> None:
        """(key, model, answer) triples; the first writer wins (answers are deterministic)."""
        if not entries:
            return
        await self.pool.executemany(
            "INSERT INTO answer_cache (key, model, response, prompt_tokens, completion_tokens)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO NOTHING",
            # PostgreSQL text cannot hold NUL; the answer is cached without it
            [
                (k, m, a.response.replace("\x00", "\ufffd"), a.prompt_tokens, a.completion_tokens)
                for k, m, a in entries
            ],
        )
