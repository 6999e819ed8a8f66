"""The answer cache, shared by every worker through PostgreSQL.

It also holds log-likelihood scores (one per scoring request: a choice's continuation, or a
document), under keys of their own kind (keys.score_cache_key), as a small JSON record in
the response column (score_entry / score_from_entry).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import asyncpg

from evalstream.worker.engines.base import LLOutput


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


def score_entry(out: LLOutput) -> CachedAnswer:
    """A score as a cache entry (floats written so that they read back bit for bit)."""
    record = {
        "loglikelihood": out.loglikelihood,
        "is_greedy": out.is_greedy,
        "truncated": out.truncated,
    }
    return CachedAnswer(json.dumps(record), out.prompt_tokens, out.scored_tokens)


def score_from_entry(entry: CachedAnswer) -> LLOutput | None:
    """The score of a cache entry, or None for one that is not a score (a miss then)."""
    try:
        record = json.loads(entry.response)
        ll, greedy, truncated = record["loglikelihood"], record["is_greedy"], record["truncated"]
    except (ValueError, TypeError, KeyError):
        return None
    if (
        not isinstance(ll, float | int)
        or isinstance(ll, bool)
        or math.isnan(ll)
        or not isinstance(greedy, bool)
    ):
        return None
    return LLOutput(float(ll), greedy, entry.prompt_tokens, entry.completion_tokens, bool(truncated))
