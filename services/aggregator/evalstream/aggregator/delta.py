"""The Delta Lake table of results: one table for every run, in the results bucket
(`s3://<results bucket>/tables/item_results`), partitioned by run, written with delta-rs.

Columns: the result columns of item_results plus the run's metadata (model, manifest hash,
dataset version), so that a data team reads one table with DuckDB, pandas, polars or Spark:

    SELECT * FROM delta_scan('s3://evalstream-results/tables/item_results') WHERE run_id = '…'

One commit per aggregator window (sink.py), exactly once per Kafka record, the way Spark's
Kafka-to-Delta sink uses its batch id:

* Every commit carries a Delta transaction identifier per input partition it covers (app id
  `evalstream-aggregator/<topic>/<partition>`, version = the offset after the last record of
  that partition in the window), atomically with its rows. A window redone after a crash
  (killed between the Delta commit and the Kafka commit) finds those versions and leaves out
  the records below them: nothing is added twice, not even an empty commit.
* The rows a window adds are those whose `source` (migration 006) is one of its records at or
  above that version: a new row is appended; a success that replaced a recorded failure (a
  redrive), or a row found again after a crash, is merged on `(run_id, item_id)` (inserted if
  missing, a failure replaced by a success, nothing else touched).
* A run's small files are compacted when it completes.
* Upkeep (`maintain`, after a compaction, at most once an interval): expired log files
  deleted, the files compactions replaced vacuumed once past the tombstone retention, the
  retention settings brought to TABLE_CONFIG on a table an earlier version made. Commits
  skip delta-rs' own log cleanup, which lists the whole log after every commit.

Concurrency: the table has one writer at a time across every aggregator, the holder of the
sink's mirror lock (a PostgreSQL advisory lock: sink.SinkLock), and every write starts from
the table's latest version; so the S3 store needs no lock service:
`AWS_S3_ALLOW_UNSAFE_RENAME` tells delta-rs so (docs/delta.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import TableNotFoundError

from evalstream.aggregator.objects import SCHEMA as RESULT_SCHEMA
from evalstream.aggregator.store import ResultStore, RunMeta
from evalstream.common.results import RUN_ID_AT, ResultRow, result_columns
from evalstream.common.settings import S3Settings

log = logging.getLogger("evalstream.aggregator.delta")

TABLE_PATH = "tables/item_results"
RUN_COLUMNS = ("model", "manifest_sha256", "dataset_sha256")
SCHEMA = pa.schema([*RESULT_SCHEMA, *((c, pa.string()) for c in RUN_COLUMNS)])
PARTITION_BY = ["run_id"]
# Where a commit's commit info names the transaction versions it carries (TransactionVersions)
TXNS_KEY = "evalstream_txns"
# Operations that never carry a transaction: compaction and upkeep (`maintain`)
NO_TRANSACTIONS = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES"})
TABLE_CONFIG: dict[str, str | None] = {
    # Transaction identifiers of long-finished shards expire from the table's state after
    # this (a redelivery arrives within minutes, not weeks).
    "delta.setTransactionRetentionDuration": "interval 30 days",
    # Time travel reaches this far back: log files older than this (and behind a checkpoint)
    # are deleted by `maintain`. A slow run commits twice a second, 170,000 commits a day.
    "delta.logRetentionDuration": "interval 7 days",
    # A file a compaction replaced stays (for readers of older versions) this long, then
    # `maintain` vacuums it. Each checkpoint carries every file removed within it (Delta's
    # default of a week kept a week of compacted window files in every checkpoint).
    "delta.deletedFileRetentionDuration": "interval 1 days",
}
# delta-rs' post-commit hook deletes expired log files after every commit, and to find them
# lists the whole log: a LIST that grows by one object per window, paid under the sink's
# lock (on SeaweedFS, a window's commit took 33 ms at 250 versions and 55-61 ms at 1,500;
# 33-35 ms without the cleanup). Commits keep the checkpoints and leave the cleanup to
# `maintain`.
COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
# Compaction writes a run's rows in row groups of this many rows, one file at a time. The
# Parquet writer holds a whole row group in memory, and delta-rs' default (a million rows)
# made compaction hold the whole run: +210 MiB at 150,000 rows, against +84 at 15,000, on
# top of the aggregator's ~120. Row groups of 2,048 rows keep it about flat (+84 and +68)
# and compact 3x faster; readers see a few dozen row groups per 100,000 rows.
COMPACT_ROW_GROUP_ROWS = 2048
COMPACT_WRITER = WriterProperties(max_row_group_size=COMPACT_ROW_GROUP_ROWS)


def table_uri(settings: S3Settings) -> str:
    return f"s3://{settings.s3_bucket_results}/{TABLE_PATH}"


def storage_options(settings: S3Settings) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": settings.s3_endpoint,
        "AWS_ACCESS_KEY_ID": settings.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": settings.s3_secret_key,
        "AWS_REGION": settings.s3_region,
        "AWS_ALLOW_HTTP": "true" if settings.s3_endpoint.startswith("http://") else "false",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",  # one writer at a time (sink.SinkLock.mirror)
        "AWS_FORCE_PATH_STYLE": "true",
    }


def app_id(topic: str, partition: int) -> str:
    """The transaction identifier of one input partition of the aggregator."""
    return f"evalstream-aggregator/{topic}/{partition}"


def to_arrow(rows: Sequence[ResultRow], meta: Mapping[str, RunMeta]) -> pa.Table:
    columns = result_columns(rows)
    runs = [meta[r] for r in columns[RUN_ID_AT]]
    columns += [tuple(getattr(m, c) for m in runs) for c in RUN_COLUMNS]
    arrays = [pa.array(values, type=f.type) for values, f in zip(columns, SCHEMA, strict=True)]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


class TransactionVersions:
    """The transaction versions the table holds, kept between windows and brought up to date
    from the commits made since (`held`).

    Asking the table (`DeltaTable.transaction_version`) replays its log for each identifier:
    tens of milliseconds each, several per window, all under the sink's mirror lock. Every
    commit this sink makes names its transactions in its commit info as well (TXNS_KEY,
    written atomically with them), so the commits since the last look, read from the table's
    history (a few small files), tell what changed; a compaction carries none. A commit of
    anything else (another writer, an unknown operation), a gap in the history or a table
    older than the last look sends every identifier back to the table. Nothing is assumed of
    who owns which partition: a writer that lost its partition and still committed is seen
    like any other commit."""

    def __init__(self) -> None:
        self.known: dict[str, int | None] = {}
        self.as_of: int | None = None  # the table version `known` holds for

    def held(self, table: DeltaTable, app_ids: Sequence[str]) -> dict[str, int | None]:
        version = table.version()
        if self.as_of is not None and (version < self.as_of or not self._catch_up(table, version)):
            self.known.clear()
        for a in app_ids:
            if a not in self.known:
                self.known[a] = table.transaction_version(a)
        self.as_of = version
        return {a: self.known[a] for a in app_ids}

    def _catch_up(self, table: DeltaTable, version: int) -> bool:
        """Applies the commits after `as_of` up to `version`; False where one cannot be read."""
        assert self.as_of is not None
        if version == self.as_of:
            return True
        commits = table.history(limit=version - self.as_of)
        if sorted(c.get("version", -1) for c in commits) != list(range(self.as_of + 1, version + 1)):
            return False
        for commit in sorted(commits, key=lambda c: c["version"]):
            if TXNS_KEY in commit:
                try:
                    txns = json.loads(commit[TXNS_KEY])
                except (TypeError, ValueError):
                    return False
                if not isinstance(txns, dict):
                    return False
                for a, v in txns.items():
                    if not isinstance(v, int):
                        return False
                    if a in self.known:
                        self.known[a] = v
            elif commit.get("operation") not in NO_TRANSACTIONS:
                return False
        return True


class DeltaResults:
    """The table, opened once and brought up to date before each write (blocking: call it
    from a thread)."""

    def __init__(
        self,
        uri: str,
        options: dict[str, str],
        config: Mapping[str, str | None] = TABLE_CONFIG,
        hooks: PostCommitHookProperties = COMMIT_HOOKS,
    ) -> None:
        self.uri = uri
        self.options = options
        self.config = dict(config)  # the table's settings (TABLE_CONFIG; tests shorten them)
        self.hooks = hooks  # after each commit (COMMIT_HOOKS; bench/delta_log.py compares others)
        self._table: DeltaTable | None = None
        self.versions = TransactionVersions()

    def table(self, *, refresh: bool = True) -> DeltaTable | None:
        """The table at its latest version (`refresh`), or as last read: the sink reads it
        once per window, under the lock that keeps every other writer out until it commits."""
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri, storage_options=self.options)
            except TableNotFoundError:
                return None
        elif refresh:
            self._table.update_incremental()
        return self._table

    def held(self, app_ids: Sequence[str]) -> dict[str, int | None]:
        """The version the table holds of each transaction identifier (None: never seen), as
        of its latest version."""
        table = self.table()
        if table is None:
            return dict.fromkeys(app_ids)
        return self.versions.held(table, app_ids)

    def commit(
        self,
        appended: Sequence[ResultRow],
        merged: Sequence[ResultRow],
        meta: Mapping[str, RunMeta],
        transactions: Mapping[str, int],
    ) -> bool:
        """One commit of the rows with `transactions` (app id -> version); False when there
        was nothing to write."""
        if not appended and not merged:
            return False
        commit = CommitProperties(
            app_transactions=[Transaction(a, v) for a, v in sorted(transactions.items())],
            custom_metadata={
                "writer": "evalstream-aggregator",
                TXNS_KEY: json.dumps(dict(sorted(transactions.items()))),
            },
        )
        table = self.table(refresh=False)  # read by held() in this window, under the same lock
        if not merged or table is None:
            write_deltalake(
                table if table is not None else self.uri,
                to_arrow([*appended, *merged], meta),
                mode="append",
                partition_by=PARTITION_BY,
                # a table made before item_results gained columns (migration 004) takes them on
                schema_mode="merge",
                configuration=self.config if table is None else None,
                storage_options=self.options if table is None else None,
                commit_properties=commit,
                post_commithook_properties=self.hooks,
            )
            return True
        rows = [*appended, *merged]
        runs = sorted({r[RUN_ID_AT] for r in rows})
        in_runs = ", ".join("'" + r.replace("'", "''") + "'" for r in runs)
        (
            table.merge(
                to_arrow(rows, meta),
                # the literal run list prunes the merge to those runs' partitions
                predicate=f"t.run_id IN ({in_runs}) AND t.run_id = s.run_id AND t.item_id = s.item_id",
                source_alias="s",
                target_alias="t",
                commit_properties=commit,
                post_commithook_properties=self.hooks,
                merge_schema=True,
            )
            .when_matched_update_all(predicate="t.error IS NOT NULL AND s.error IS NULL")
            .when_not_matched_insert_all()
            .execute()
        )
        return True

    def compact(self, run_id: str) -> dict[str, Any]:
        """Rewrites a finished run's small files into few (the old ones stay for time
        travel until a vacuum)."""
        table = self.table()
        if table is None:
            return {}
        return dict(
            table.optimize.compact(
                partition_filters=[("run_id", "=", run_id)],
                max_concurrent_tasks=1,
                writer_properties=COMPACT_WRITER,
                post_commithook_properties=self.hooks,
            )
        )

    def maintain(self) -> dict[str, int]:
        """The table's upkeep: its settings brought to `config` (a table made by an earlier
        version has Delta's default retentions), log files past the log retention deleted
        (those behind the latest checkpoint only), the files a compaction replaced longer
        ago than the tombstone retention vacuumed (delta-rs' lite vacuum: the removals the
        table records, no listing of the whole table; it names a removal again until a
        checkpoint drops it, and deleting it again is a no-op). Writes to the table: call it
        under the sink's mirror lock."""
        table = self.table()
        if table is None:
            return {}
        configured = table.metadata().configuration
        changed = {k: v for k, v in self.config.items() if v is not None and configured.get(k) != v}
        if changed:
            table.alter.set_table_properties(changed, post_commithook_properties=self.hooks)
        table.cleanup_metadata()
        # the retention is the table's own setting (enforced: never shorter than it)
        vacuumed = table.vacuum(dry_run=False, post_commithook_properties=self.hooks)
        return {"properties_set": len(changed), "files_vacuumed": len(vacuumed)}


class DeltaMirror:
    """The aggregator's side: run metadata from its store (cached once the run has its
    manifest), table writes off the event loop, upkeep at most once per `maintenance_s`."""

    def __init__(self, results: DeltaResults, store: ResultStore, maintenance_s: float = 3600.0) -> None:
        self.results = results
        self.store = store
        self.maintenance_s = maintenance_s
        self._maintained_at: float | None = None  # monotonic time of the last upkeep
        self._meta: dict[str, RunMeta] = {}

    async def held(self, app_ids: Sequence[str]) -> dict[str, int | None]:
        return await asyncio.to_thread(self.results.held, app_ids)

    async def commit(
        self, appended: Sequence[ResultRow], merged: Sequence[ResultRow], transactions: Mapping[str, int]
    ) -> bool:
        meta = await self.run_meta({r[RUN_ID_AT] for r in (*appended, *merged)})
        return await asyncio.to_thread(self.results.commit, appended, merged, meta, transactions)

    async def compact(self, run_id: str) -> None:
        """Derived work: a failure is logged, never allowed to hold up a batch."""
        try:
            metrics = await asyncio.to_thread(self.results.compact, run_id)
            log.info("run %s: Delta files compacted: %s", run_id, metrics.get("numFilesRemoved"))
        except Exception:
            log.exception("run %s: Delta compaction failed (the table is intact)", run_id)

    async def maintain(self) -> bool:
        """The table's upkeep (DeltaResults.maintain) unless done within `maintenance_s`;
        derived work like compaction: a failure is logged and tried again next interval.
        True when it ran."""
        now = time.monotonic()
        if self._maintained_at is not None and now - self._maintained_at < self.maintenance_s:
            return False
        self._maintained_at = now
        try:
            done = await asyncio.to_thread(self.results.maintain)
            log.info("Delta table upkeep: %s", done)
        except Exception:
            log.exception("Delta table upkeep failed (the table is intact)")
        return True

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
