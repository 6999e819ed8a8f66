"""Result files in the S3 store: a run's rows in Parquet segments of SEGMENT_ROWS ordinals
(the order they were recorded in, migration 006), under deterministic names
(`runs/<run>/results/part-00000.parquet`, ...). A window rewrites the segments its rows fell
into from the database rows, so S3 always mirrors PostgreSQL and a rewrite is idempotent. A
window's block of ordinals that would straddle the end of the open segment starts the next
one (store.ALLOCATE_ORDINALS): a fast run's windows of thousands of rows each get segments of
their own, never reading back and encoding again another window's rows, while a slow run's
small windows fill its open segment, which is rewritten as it grows. Every segment but the
last is then more than half full (less only where a redelivery left its reserved ordinals
unused): a finished run has rows / SEGMENT_ROWS files, up to twice as many, whatever its
shards were."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from minio import Minio

from evalstream.common import storage
from evalstream.common.keys import run_object_name, segment_object_name
from evalstream.common.results import RESULT_COLUMNS, ResultRow, arrow_schema, result_columns

SCHEMA = arrow_schema(RESULT_COLUMNS)  # S3 mirrors PostgreSQL column for column


def rows_to_parquet(rows: Sequence[ResultRow]) -> bytes:
    arrays = [pa.array(values, type=f.type) for values, f in zip(result_columns(rows), SCHEMA, strict=True)]
    table = pa.Table.from_arrays(arrays, schema=SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


SEGMENT_ROWS = 4096  # rows per Parquet file: big enough to read fast, small to rewrite


def segment_of(ordinal: int) -> int:
    return ordinal // SEGMENT_ROWS


def segment_bounds(segment: int) -> tuple[int, int]:
    """[first, end) ordinals of a segment."""
    return segment * SEGMENT_ROWS, (segment + 1) * SEGMENT_ROWS


MAX_READ_SPANS = 16  # a segment's rows read in this many spans at most, else all of it


def spans_without(first: int, end: int, held: Iterable[int]) -> list[tuple[int, int]] | None:
    """The [first, end) spans of ordinals left when the `held` ones are taken out, or None
    when they are more than MAX_READ_SPANS (then the whole segment is read)."""
    spans: list[tuple[int, int]] = []
    start = first
    for ordinal in [*sorted(o for o in held if first <= o < end), end]:
        if ordinal > start:
            spans.append((start, ordinal))
        start = ordinal + 1
    return spans if len(spans) <= MAX_READ_SPANS else None


def write_segment(
    s3: Minio,
    bucket: str,
    run_id: str,
    segment: int,
    rows: Sequence[ResultRow],
) -> str:
    name = segment_object_name(run_id, segment)
    storage.put_bytes(s3, bucket, name, rows_to_parquet(rows), "application/vnd.apache.parquet")
    return name


def write_report(s3: Minio, bucket: str, run_id: str, summary: dict[str, Any]) -> str:
    name = run_object_name(run_id, "report.json")
    storage.put_bytes(
        s3, bucket, name, json.dumps(summary, indent=2, sort_keys=True).encode(), "application/json"
    )
    return name
