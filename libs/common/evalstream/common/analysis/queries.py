"""Every read of the result tables, `item_results` and `runs`: the one module with their
SELECTs (tests/unit/test_boundaries.py holds every other module to that; the writes stay on
the write path, the producer's intake and the aggregator's store).

Column lists are named from the column table of the writes (evalstream.common.results), so a
column that is renamed or dropped there fails here at import, not at the first query. The
functions take a connection or a pool and return asyncpg records (or plain values); what the
rows mean is for the modules beside this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import asyncpg

from evalstream.common.results import COLUMN_TYPES

Conn: TypeAlias = asyncpg.Connection | asyncpg.Pool
QUERY_TIMEOUT_S = 20.0  # a page of the item browser, a filter's count, two runs' statistics
CELL_CHARS = 300  # text per table cell; the item's own page shows it whole
MAX_COUNTED = 10_000  # a filter's matches are counted up to this
MAX_FACETS = 200  # choices per filter menu
MAX_DISTINCT_DIFFS = 100_000  # per-item score differences in a bootstrap histogram
# item_results' columns the database fills in (migration 004's generated outcome, the time of
# the write): read, never written by the aggregator
_READ_ONLY = ("outcome", "recorded_at")


def columns(*names: str) -> str:
    """`names` as a select list, each checked against item_results' columns."""
    unknown = [n for n in names if n not in COLUMN_TYPES and n not in _READ_ONLY]
    if unknown:
        raise KeyError(f"not columns of item_results: {unknown}")
    return ", ".join(names)


def clipped(column: str, alias: str | None = None, prefix: str = "") -> str:
    """The head of a text column (CELL_CHARS) and its whole length, as `alias`, `alias`_chars."""
    name = alias or column
    columns(column)
    return f"left({prefix}{column}, {CELL_CHARS}) AS {name}, length({prefix}{column}) AS {name}_chars"


# --------------------------------------------------------------------------- runs


async def run(conn: Conn, run_id: str, select: str = "*") -> asyncpg.Record | None:
    """The run's row (`select`: the columns wanted, all by default), None for no such run."""
    return await conn.fetchrow(f"SELECT {select} FROM runs WHERE run_id = $1", run_id)


async def runs(conn: Conn, run_ids: Sequence[str], select: str = "*") -> list[asyncpg.Record]:
    """The rows of those of `run_ids` that exist."""
    return list(await conn.fetch(f"SELECT {select} FROM runs WHERE run_id = ANY($1::text[])", list(run_ids)))


async def completed_runs(conn: Conn, dataset_sha256: str, select: str = "run_id") -> list[asyncpg.Record]:
    """Every completed run on a dataset version."""
    return list(
        await conn.fetch(
            f"SELECT {select} FROM runs WHERE dataset_sha256 = $1 AND status = 'completed'", dataset_sha256
        )
    )


async def recorded(conn: Conn, run_id: str) -> int | None:
    """The run's result count, kept by the aggregator (no count over its rows)."""
    return await conn.fetchval("SELECT recorded FROM runs WHERE run_id = $1", run_id)


async def progress(conn: Conn, run_id: str) -> asyncpg.Record | None:
    """status, total, problems, done (results recorded) and failed (dead letters pending)."""
    return await conn.fetchrow(
        "SELECT status, total, problems, recorded AS done, (SELECT count(*) FROM dead_letters d"
        " WHERE d.run_id = r.run_id AND d.redriven_at IS NULL) AS failed FROM runs r WHERE run_id = $1",
        run_id,
    )


async def runs_per_dataset(conn: Conn) -> dict[str, int]:
    """dataset version (content_sha256) -> how many runs it has had."""
    rows = await conn.fetch("SELECT dataset_sha256, count(*) AS n FROM runs GROUP BY dataset_sha256")
    return {r["dataset_sha256"]: r["n"] for r in rows}


# --------------------------------------------------------------------------- one run's results


async def results(conn: Conn, run_id: str, names: Sequence[str]) -> list[asyncpg.Record]:
    """The run's results, `names` of each, in item order."""
    return list(
        await conn.fetch(
            f"SELECT {columns(*names)} FROM item_results WHERE run_id = $1 ORDER BY item_id", run_id
        )
    )


async def answered_ids(conn: Conn, run_id: str) -> list[asyncpg.Record]:
    """The items that got an answer and no error (what a regrade grades again)."""
    return list(
        await conn.fetch(
            "SELECT item_id FROM item_results WHERE run_id = $1 AND error IS NULL AND response IS NOT NULL"
            " ORDER BY item_id",
            run_id,
        )
    )


async def status_counts(conn: Conn, run_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT count(*) AS done, count(*) FILTER (WHERE error IS NOT NULL) AS failed,"
        " count(*) FILTER (WHERE attempts > 1) AS retried, count(*) FILTER (WHERE cache_hit) AS cache_hits,"
        " min(recorded_at) AS first, max(recorded_at) AS last FROM item_results WHERE run_id = $1",
        run_id,
    )
    assert row is not None  # an aggregate has a row
    return row


TOTALS = """
SELECT count(*) AS n,
       count(*) FILTER (WHERE error IS NULL) AS succeeded,
       count(*) FILTER (WHERE error IS NOT NULL) AS failed,
       coalesce(sum(score), 0) AS score_sum,
       coalesce(sum(score) FILTER (WHERE error IS NULL), 0) AS answered_score_sum,
       count(*) FILTER (WHERE cache_hit) AS cache_hits,
       count(*) FILTER (WHERE attempts > 1) AS retried,
       count(*) FILTER (WHERE truncated) AS truncated,
       coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
       coalesce(sum(completion_tokens), 0) AS completion_tokens,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE error IS NULL) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE error IS NULL) AS p95,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) FILTER (WHERE error IS NULL) AS p99,
       max(recorded_at) AS last_recorded
FROM item_results WHERE run_id = $1
"""
BREAKDOWN = """
SELECT {col} AS key, count(*) AS n, coalesce(sum(score), 0) AS score_sum,
       count(*) FILTER (WHERE error IS NOT NULL) AS failed
FROM item_results WHERE run_id = $1 AND {col} IS NOT NULL AND {col} <> '' GROUP BY {col} ORDER BY {col}
"""
# What actually answered: the manifest names the model SPEC; the weights (or answer file)
# behind it are known only to the workers, which report their engine's revision per item.
REVISIONS = """
SELECT served_by, model_revision, count(*) AS n FROM item_results
WHERE run_id = $1 AND error IS NULL GROUP BY served_by, model_revision ORDER BY served_by, model_revision
"""
# The sums lm-eval's metrics of a log-likelihood run are computed from (reports.scores_from_sums).
SCORE_SUMS = """
SELECT count(*) FILTER (WHERE error IS NULL) AS scored,
       coalesce(sum(score) FILTER (WHERE error IS NULL AND correct_norm IS NOT NULL), 0) AS mc_acc_sum,
       count(*) FILTER (WHERE error IS NULL AND correct_norm IS NOT NULL) AS mc_n,
       count(*) FILTER (WHERE error IS NULL AND correct_norm) AS mc_norm_sum,
       coalesce(sum(score) FILTER (WHERE error IS NULL AND correct_norm IS NULL
                                   AND loglikelihood IS NOT NULL AND doc_words IS NULL), 0) AS one_acc_sum,
       count(*) FILTER (WHERE error IS NULL AND correct_norm IS NULL
                        AND loglikelihood IS NOT NULL AND doc_words IS NULL) AS one_n,
       coalesce(sum(loglikelihood) FILTER (WHERE error IS NULL AND correct_norm IS NULL
                                           AND doc_words IS NULL), 0) AS one_ll_sum,
       count(*) FILTER (WHERE error IS NULL AND doc_words IS NOT NULL) AS docs,
       coalesce(sum(loglikelihood) FILTER (WHERE error IS NULL AND doc_words IS NOT NULL), 0) AS doc_ll_sum,
       coalesce(sum(doc_words) FILTER (WHERE error IS NULL AND doc_words IS NOT NULL), 0)::int8 AS words,
       -- the sum of an int8 column is numeric (Decimal): a count of bytes fits an int8
       coalesce(sum(doc_bytes) FILTER (WHERE error IS NULL AND doc_words IS NOT NULL), 0)::int8 AS bytes
FROM item_results WHERE run_id = $1
"""
DETAILS = "SELECT detail FROM item_results WHERE run_id = $1 AND error IS NULL AND detail IS NOT NULL"
LATENCY_HISTOGRAM = """
SELECT width_bucket(latency_ms, $2::float8[]) AS b, count(*) AS n
FROM item_results WHERE run_id = $1 AND error IS NULL GROUP BY b
"""
TIMELINE = """
SELECT floor(greatest(0, extract(epoch FROM recorded_at - $2::timestamptz)) / $3)::int AS b,
       count(*) AS n, count(*) FILTER (WHERE error IS NOT NULL) AS failed
FROM item_results WHERE run_id = $1 GROUP BY b ORDER BY b
"""
FAILURES = """
SELECT item_id, error, attempts, served_by, category FROM item_results
WHERE run_id = $1 AND error IS NOT NULL ORDER BY item_id LIMIT $2
"""
RUN_SPAN = (
    "SELECT coalesce(r.published_at, r.created_at) AS start, max(i.recorded_at) AS last"
    " FROM runs r LEFT JOIN item_results i ON i.run_id = r.run_id WHERE r.run_id = $1"
    " GROUP BY r.published_at, r.created_at"
)


# --------------------------------------------------------------------------- pages of items

# A table row of the item browser (clipped text), and the whole of every field (the static
# report's expandable rows; one item's page).
ROW_COLUMNS = ", ".join(
    [
        columns("item_id", "category", "outcome", "score", "attempts", "served_by", "latency_ms"),
        columns("cache_hit", "truncated"),
        *(clipped(c) for c in ("question", "gold", "response", "extracted", "error", "detail")),
    ]
)
FULL_COLUMNS = columns(
    *[
        "item_id",
        "category",
        "outcome",
        "score",
        "attempts",
        "served_by",
        "latency_ms",
        "cache_hit",
        "truncated",
        "question",
        "gold",
        "response",
        "extracted",
        "error",
        "detail",
        "evidence",
        "prompt",
        "prompt_tokens",
        "completion_tokens",
        "model_revision",
        "shard_id",
        "recorded_at",
        "correct",
    ]
)


async def item_rows(conn: Conn, select: str, where: str, args: Sequence[Any]) -> list[asyncpg.Record]:
    """A page of a run's rows by (outcome, item_id): `where` holds the filter and keyset
    conditions on `args` (run_id first), whose last is the page's LIMIT."""
    return list(
        await conn.fetch(
            f"SELECT {select} FROM item_results WHERE run_id = $1{where}"
            f" ORDER BY outcome, item_id LIMIT ${len(args)}",
            *args,
            timeout=QUERY_TIMEOUT_S,
        )
    )


async def count_matching(conn: Conn, where: str, args: Sequence[Any]) -> int | None:
    """Rows of run `args[0]` that meet `where`, counted up to MAX_COUNTED + 1."""
    return await conn.fetchval(
        f"SELECT count(*) FROM (SELECT 1 FROM item_results WHERE run_id = $1{where}"
        f" LIMIT {MAX_COUNTED + 1}) AS m",
        *args,
        timeout=QUERY_TIMEOUT_S,
    )


async def one_item(conn: Conn, run_id: str, item_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        f"SELECT {FULL_COLUMNS} FROM item_results WHERE run_id = $1 AND item_id = $2",
        run_id,
        item_id,
        timeout=QUERY_TIMEOUT_S,
    )


async def distinct_values(conn: Conn, run_id: str, column: str) -> list[asyncpg.Record]:
    """Up to MAX_FACETS distinct values of `column` (x) in a run: a loose index scan, one
    index probe per value, not a pass over the run."""
    columns(column)
    return list(
        await conn.fetch(
            f"""WITH RECURSIVE v(x, n) AS (
                  (SELECT {column}, 1 FROM item_results WHERE run_id = $1 AND {column} IS NOT NULL
                   ORDER BY {column} LIMIT 1)
                  UNION ALL
                  SELECT (SELECT {column} FROM item_results WHERE run_id = $1 AND {column} > v.x
                          ORDER BY {column} LIMIT 1), v.n + 1
                  FROM v WHERE v.x IS NOT NULL AND v.n < {MAX_FACETS}
                ) SELECT x FROM v WHERE x IS NOT NULL""",
            run_id,
            timeout=QUERY_TIMEOUT_S,
        )
    )


# --------------------------------------------------------------------------- two runs

# Per common item: 0 right in A only, 1 right in B only (the flips), 2 same verdict but a
# different answer, 3 the same answer.
_RANK = (
    "CASE WHEN a.outcome = 3 AND b.outcome <> 3 THEN 0 WHEN b.outcome = 3 AND a.outcome <> 3 THEN 1"
    " WHEN a.response IS DISTINCT FROM b.response THEN 2 ELSE 3 END"
)
_SCORE_A = "CASE WHEN a.error IS NULL THEN a.score ELSE 0 END"
_SCORE_B = "CASE WHEN b.error IS NULL THEN b.score ELSE 0 END"
_JOIN = (
    "FROM item_results a JOIN item_results b ON b.run_id = $2 AND b.item_id = a.item_id WHERE a.run_id = $1"
)


async def pair_totals(conn: Conn, run_a: str, run_b: str) -> asyncpg.Record:
    """Over the items of both runs: how many, flips each way, identical answers, score sums."""
    row = await conn.fetchrow(
        f"""SELECT count(*) AS common,
                   count(*) FILTER (WHERE a.outcome = 3 AND b.outcome <> 3) AS a_only,
                   count(*) FILTER (WHERE b.outcome = 3 AND a.outcome <> 3) AS b_only,
                   count(*) FILTER (WHERE a.response IS NOT DISTINCT FROM b.response) AS identical,
                   coalesce(sum({_SCORE_A}), 0) AS a_sum, coalesce(sum({_SCORE_B}), 0) AS b_sum
            {_JOIN}""",
        run_a,
        run_b,
        timeout=QUERY_TIMEOUT_S,
    )
    assert row is not None  # an aggregate has a row
    return row


async def result_counts(conn: Conn, run_ids: Sequence[str]) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT run_id, count(*) AS n FROM item_results WHERE run_id = ANY($1::text[]) GROUP BY run_id",
        list(run_ids),
        timeout=QUERY_TIMEOUT_S,
    )
    return {r["run_id"]: r["n"] for r in rows}


async def score_differences(conn: Conn, run_a: str, run_b: str) -> dict[float, int]:
    """How many common items have each score difference (B - A, a failed item scoring 0)."""
    rows = await conn.fetch(
        f"SELECT round(({_SCORE_B} - {_SCORE_A})::numeric, 9)::float8 AS d, count(*) AS n {_JOIN}"
        f" GROUP BY d LIMIT {MAX_DISTINCT_DIFFS}",
        run_a,
        run_b,
        timeout=QUERY_TIMEOUT_S,
    )
    return {r["d"]: r["n"] for r in rows}


async def verdicts_changed(conn: Conn, run_a: str, run_b: str) -> asyncpg.Record:
    """changed (items whose verdict differs) and newly_failed (answered in A, failed in B)."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE a.correct IS DISTINCT FROM b.correct) AS changed,"
        " count(*) FILTER (WHERE a.error IS NULL AND b.error IS NOT NULL) AS newly_failed"
        " FROM item_results a JOIN item_results b ON b.item_id = a.item_id AND b.run_id = $2"
        " WHERE a.run_id = $1",
        run_a,
        run_b,
    )
    assert row is not None
    return row


async def pair_rows(
    conn: Conn, run_a: str, run_b: str, max_rank: int, key: list[Any] | None, limit: int
) -> list[asyncpg.Record]:
    """Common items of two runs side by side, by (rank, item_id) up to `max_rank`, after `key`."""
    args: list[Any] = [run_a, run_b, max_rank]
    keyset = ""
    if key is not None:
        args += key
        keyset = " AND (rank, item_id) > ($4::int, $5)"
    args.append(limit)
    return list(
        await conn.fetch(
            f"""SELECT * FROM (
              SELECT {_RANK} AS rank, a.item_id, a.category,
                     {clipped("question", prefix="a.")}, {clipped("gold", prefix="a.")},
                     a.outcome AS a_outcome, b.outcome AS b_outcome,
                     {clipped("response", "a_response", "a.")}, {clipped("response", "b_response", "b.")},
                     {clipped("extracted", "a_extracted", "a.")}, {clipped("extracted", "b_extracted", "b.")},
                     {clipped("error", "a_error", "a.")}, {clipped("error", "b_error", "b.")}
              {_JOIN}) AS pair
            WHERE rank <= $3{keyset} ORDER BY rank, item_id LIMIT ${len(args)}""",
            *args,
            timeout=QUERY_TIMEOUT_S,
        )
    )
