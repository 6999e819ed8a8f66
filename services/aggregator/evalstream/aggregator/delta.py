"""The Delta Lake table of results: one table for every run, in the results bucket
(`s3://<results bucket>/tables/item_results`), partitioned by run, written with delta-rs.

Columns: the result columns of item_results plus the run's metadata (model, manifest hash,
dataset version), so that a data team reads one table with DuckDB, pandas, polars or Spark:

    SELECT * FROM delta_scan('s3://evalstream-results/tables/item_results') WHERE run_id = '…'

Like the Parquet mirror, the table is written from the database rows of the shards a batch
touched, before the batch's offsets are committed, and each write is idempotent per shard:

* Every shard write carries a Delta transaction identifier (app id `evalstream/<shard>`,
  version = the shard's rows plus its successes, which only grows: rows are only added and
  failures only replaced by successes). A shard whose version the table already holds is
  skipped, so a redelivered shard (or a batch redone after a kill -9 between the Delta
  commit and the Kafka commit) adds nothing. The identifier commits atomically with the rows.
* A shard the table has never seen is appended; one seen before is merged on
  `(run_id, item_id)`: new items inserted, a failure replaced by a later success (a redrive),
  nothing else touched.
* A run's small files are compacted when it completes.

Concurrency: there is one writer per table at a time (the aggregator's writes hold its mirror
lock), so the S3 store needs no lock service: `AWS_S3_ALLOW_UNSAFE_RENAME` tells delta-rs so.
Scaling the aggregator out would need the store's conditional put (`conditional_put=etag`)
or a lock service (docs/delta.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from evalstream.aggregator.objects import SCHEMA as RESULT_SCHEMA
from evalstream.aggregator.store import ResultStore, RunMeta
from evalstream.common.settings import S3Settings

log = logging.getLogger("evalstream.aggregator.delta")

TABLE_PATH = "tables/item_results"
RUN_COLUMNS = ("model", "manifest_sha256", "dataset_sha256")
SCHEMA = pa.schema([*RESULT_SCHEMA, *((c, pa.string()) for c in RUN_COLUMNS)])
PARTITION_BY = ["run_id"]
# Transaction identifiers of long-finished shards expire from the table's state after this
# (a redelivery arrives within minutes, not weeks).
TABLE_CONFIG: dict[str, str | None] = {"delta.setTransactionRetentionDuration": "interval 30 days"}

Row = Mapping[str, Any]


def table_uri(settings: S3Settings) -> str:
    return f"s3://{settings.s3_bucket_results}/{TABLE_PATH}"


def storage_options(settings: S3Settings) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": settings.s3_endpoint,
        "AWS_ACCESS_KEY_ID": settings.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": settings.s3_secret_key,
        "AWS_REGION": settings.s3_region,
        "AWS_ALLOW_HTTP": "true" if settings.s3_endpoint.startswith("http://") else "false",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",  # one writer (see the module's docstring)
        "AWS_FORCE_PATH_STYLE": "true",
    }


def shard_version(rows: Sequence[Row]) -> int:
    """Grows with every change a shard can see (an item added, a failure made a success)."""
    return len(rows) + sum(1 for r in rows if r["error"] is None)


def app_id(run_id: str, shard_id: str) -> str:
    return f"evalstream/{run_id}/{shard_id}"


def to_arrow(rows: Sequence[Row], meta: Mapping[str, RunMeta]) -> pa.Table:
    columns: dict[str, list[Any]] = {name: [r[name] for r in rows] for name in RESULT_SCHEMA.names}
    for c in RUN_COLUMNS:
        columns[c] = [getattr(meta[r["run_id"]], c) for r in rows]
    return pa.table(columns, schema=SCHEMA)


class DeltaResults:
    """The table, opened once and brought up to date before each write (blocking: call it
    from a thread)."""

    def __init__(self, uri: str, options: dict[str, str]) -> None:
        self.uri = uri
        self.options = options
        self._table: DeltaTable | None = None

    def table(self) -> DeltaTable | None:
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri, storage_options=self.options)
            except TableNotFoundError:
                return None
        else:
            self._table.update_incremental()
        return self._table

    def write(self, shards: Mapping[tuple[str, str], Sequence[Row]], meta: Mapping[str, RunMeta]) -> int:
        """Writes the shards whose rows the table does not hold yet; returns how many."""
        table = self.table()
        fresh: list[tuple[tuple[str, str], Sequence[Row]]] = []
        changed: list[tuple[tuple[str, str], Sequence[Row]]] = []
        for key, rows in sorted(shards.items()):
            if not rows:
                continue
            held = table.transaction_version(app_id(*key)) if table is not None else None
            if held is None:
                fresh.append((key, rows))
            elif held < shard_version(rows):
                changed.append((key, rows))
        if fresh:
            self._append(fresh, meta)
        if changed:
            self._merge(changed, meta)
        return len(fresh) + len(changed)

    def _commit(self, shards: list[tuple[tuple[str, str], Sequence[Row]]]) -> CommitProperties:
        return CommitProperties(
            app_transactions=[Transaction(app_id(*key), shard_version(rows)) for key, rows in shards],
            custom_metadata={"writer": "evalstream-aggregator"},
        )

    def _append(
        self, shards: list[tuple[tuple[str, str], Sequence[Row]]], meta: Mapping[str, RunMeta]
    ) -> None:
        data = to_arrow([r for _, rows in shards for r in rows], meta)
        table = self.table()
        write_deltalake(
            table if table is not None else self.uri,
            data,
            mode="append",
            partition_by=PARTITION_BY,
            # a table made before item_results gained columns (migration 004) takes them on
            schema_mode="merge",
            configuration=TABLE_CONFIG if table is None else None,
            storage_options=self.options if table is None else None,
            commit_properties=self._commit(shards),
        )

    def _merge(
        self, shards: list[tuple[tuple[str, str], Sequence[Row]]], meta: Mapping[str, RunMeta]
    ) -> None:
        table = self.table()
        assert table is not None
        runs = sorted({run_id for (run_id, _), _ in shards})
        in_runs = ", ".join("'" + r.replace("'", "''") + "'" for r in runs)
        (
            table.merge(
                to_arrow([r for _, rows in shards for r in rows], meta),
                # the literal run list prunes the merge to those runs' partitions
                predicate=f"t.run_id IN ({in_runs}) AND t.run_id = s.run_id AND t.item_id = s.item_id",
                source_alias="s",
                target_alias="t",
                commit_properties=self._commit(shards),
                merge_schema=True,
            )
            .when_matched_update_all(predicate="t.error IS NOT NULL AND s.error IS NULL")
            .when_not_matched_insert_all()
            .execute()
        )

    def compact(self, run_id: str) -> dict[str, Any]:
        """Rewrites a finished run's small files into few (the old ones stay for time
        travel until a vacuum)."""
        table = self.table()
        if table is None:
            return {}
        return dict(table.optimize.compact(partition_filters=[("run_id", "=", run_id)]))


class DeltaMirror:
    """The aggregator's side: run metadata from its store (cached once the run has its
    manifest), table writes off the event loop."""

    def __init__(self, results: DeltaResults, store: ResultStore) -> None:
        self.results = results
        self.store = store
        self._meta: dict[str, RunMeta] = {}

    async def write(self, shards: Mapping[tuple[str, str], Sequence[Row]]) -> int:
        meta = await self.run_meta({run_id for run_id, _ in shards})
        return await asyncio.to_thread(self.results.write, shards, meta)

    async def compact(self, run_id: str) -> None:
        """Derived work: a failure is logged, never allowed to hold up a batch."""
        try:
            metrics = await asyncio.to_thread(self.results.compact, run_id)
            log.info("run %s: Delta files compacted: %s", run_id, metrics.get("numFilesRemoved"))
        except Exception:
            log.exception("run %s: Delta compaction failed (the table is intact)", run_id)

    async def run_meta(self, run_ids: set[str]) -> dict[str, RunMeta]:
        fetched: dict[str, RunMeta] = {}
        missing = sorted(r for r in run_ids if r not in self._meta)
        if missing:
            fetched = await self.store.run_meta(missing)
            # final once the run has its manifest: it never changes after publishing
            self._meta.update({k: m for k, m in fetched.items() if m.manifest_sha256 is not None})
            while len(self._meta) > 10_000:
                self._meta.pop(next(iter(self._meta)))
        unknown = RunMeta("", None, None)
        return {r: self._meta.get(r) or fetched.get(r) or unknown for r in run_ids}
