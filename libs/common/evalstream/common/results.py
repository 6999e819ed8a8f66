"""The columns of an item result, once: their order and types in PostgreSQL (item_results)
and in Parquet (the aggregator's per-shard files in S3, `evalctl results --format parquet`),
so that every copy of the results has the same columns with the same types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

# name -> (PostgreSQL type, Arrow type), in item_results' column order
COLUMN_TYPES: dict[str, tuple[str, pa.DataType]] = {
    "run_id": ("text", pa.string()),
    "item_id": ("text", pa.string()),
    "shard_id": ("text", pa.string()),
    "response": ("text", pa.string()),
    "extracted": ("text", pa.string()),
    "correct": ("boolean", pa.bool_()),
    "score": ("float8", pa.float64()),
    "error": ("text", pa.string()),
    "attempts": ("int4", pa.int32()),
    "cache_hit": ("boolean", pa.bool_()),
    "latency_ms": ("float8", pa.float64()),
    "served_by": ("text", pa.string()),
    "model_revision": ("text", pa.string()),
    "prompt_tokens": ("int4", pa.int32()),
    "completion_tokens": ("int4", pa.int32()),
    "truncated": ("boolean", pa.bool_()),
    "category": ("text", pa.string()),
    # what the item browser shows beside the answer (the evidence is JSON, stored as text)
    "question": ("text", pa.string()),
    "gold": ("text", pa.string()),
    "prompt": ("text", pa.string()),
    "detail": ("text", pa.string()),
    "evidence": ("text", pa.string()),
    # log-likelihood scoring (migration 007; evalstream.common.scoring): what a run's acc_norm
    # and perplexities are computed from (the per-choice scores are the response, as JSON)
    "correct_norm": ("boolean", pa.bool_()),
    "loglikelihood": ("float8", pa.float64()),
    "doc_words": ("int4", pa.int32()),
    "doc_bytes": ("int8", pa.int64()),
}
RESULT_COLUMNS = tuple(COLUMN_TYPES)  # what the aggregator writes, to PostgreSQL and S3
# One record per item as `evalctl results` gives it (DESIGN.md's command table), plus the category.
EXPORT_COLUMNS = (
    "item_id",
    "response",
    "extracted",
    "correct",
    "score",
    "error",
    "attempts",
    "cache_hit",
    "latency_ms",
    "served_by",
    "category",
)


# A result row as the aggregator's sink carries it to S3 and the Delta table: its values in
# RESULT_COLUMNS' order. Columns for Arrow come from one zip over the rows, where a dict per
# row cost a lookup per value, twice (Parquet segment and Delta commit).
ResultRow = tuple[Any, ...]
RUN_ID_AT = RESULT_COLUMNS.index("run_id")


def result_columns(rows: Sequence[ResultRow]) -> list[tuple[Any, ...]]:
    """The rows' values by column, in RESULT_COLUMNS' order (each row holds exactly those)."""
    if not rows:
        return [() for _ in RESULT_COLUMNS]
    columns = list(zip(*rows, strict=True))
    if len(columns) != len(RESULT_COLUMNS):
        raise ValueError(f"a result row has {len(columns)} values, not {len(RESULT_COLUMNS)}")
    return columns


def pg_type(column: str) -> str:
    return COLUMN_TYPES[column][0]


def arrow_schema(columns: Sequence[str] = RESULT_COLUMNS) -> pa.Schema:
    """The Parquet schema of `columns` (declared, never inferred: a column that is all nulls
    in one file keeps its type)."""
    return pa.schema([(c, COLUMN_TYPES[c][1]) for c in columns])
