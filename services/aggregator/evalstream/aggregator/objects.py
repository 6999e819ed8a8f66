"""Result files in the S3 store: one Parquet file per shard under a deterministic name,
rewritten from the database rows whenever the shard changes, so S3 always mirrors
PostgreSQL and a rewrite is idempotent."""

from __future__ import annotations

import io
import json
from typing import Any

import asyncpg
import pyarrow as pa
import pyarrow.parquet as pq
from minio import Minio

from evalstream.common import storage
from evalstream.common.keys import shard_object_name
from evalstream.common.results import RESULT_COLUMNS, arrow_schema

SCHEMA = arrow_schema(RESULT_COLUMNS)  # S3 mirrors PostgreSQL column for column


def rows_to_parquet(rows: list[asyncpg.Record] | list[dict[str, Any]]) -> bytes:
    columns = {name: [r[name] for r in rows] for name in SCHEMA.names}
    table = pa.table(columns, schema=SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def write_shard(s3: Minio, bucket: str, run_id: str, shard_id: str, rows: list[asyncpg.Record]) -> str:
    name = shard_object_name(run_id, shard_id)
    storage.put_bytes(s3, bucket, name, rows_to_parquet(rows), "application/vnd.apache.parquet")
    return name


def write_report(s3: Minio, bucket: str, run_id: str, summary: dict[str, Any]) -> str:
    name = f"runs/{run_id}/report.json"
    storage.put_bytes(
        s3, bucket, name, json.dumps(summary, indent=2, sort_keys=True).encode(), "application/json"
    )
    return name
