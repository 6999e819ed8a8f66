"""Job intake: validate the whole dataset, store it and the run manifest, publish shards.

Nothing of a rejected job is published. A job redelivered after a crash (its offset was
not committed) republishes the same deterministic shards; the sinks drop the duplicates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from array import array
from dataclasses import dataclass
from typing import BinaryIO

import asyncpg
import msgspec
from minio import Minio

from evalstream.common import intake_limits, keys, storage
from evalstream.common.contract import JobRejected
from evalstream.common.datasets import DatasetError, DatasetScan, Problem, scan_dataset
from evalstream.common.jobs import job_problems
from evalstream.common.manifest import build_manifest, manifest_sha256
from evalstream.common.messages import JobSpec, encode
from evalstream.common.publishing import Send, publish_all
from evalstream.common.settings import ProducerSettings
from evalstream.producer.sharding import ShardMessages, auto_shard_size, max_chunk_bytes, plan_chunks

log = logging.getLogger("evalstream.producer")


Publish = Send  # (payload, key) -> durable on the broker


@dataclass(frozen=True)
class Rejection:
    problems: list[Problem]

    def as_json(self) -> str:
        """For runs.problems (jsonb, which stores no NUL: a field named with one is reported
        with U+FFFD instead)."""
        return json.dumps(
            [msgspec.to_builtins(p) if isinstance(p, msgspec.Struct) else p.__dict__ for p in self.problems]
        ).replace("\\u0000", "\\ufffd")


@dataclass
class Scanned:
    """A validated dataset, read once: its description, its items' JSON in `copy` (a file,
    one item per line: the stored copy) and their sizes, in order."""

    scan: DatasetScan
    copy: BinaryIO
    sizes: array[int]


class Intake:
    def __init__(self, settings: ProducerSettings, pool: asyncpg.Pool, s3: Minio) -> None:
        self.settings = settings
        self.pool = pool
        self.s3 = s3

    async def handle(self, job: JobSpec, run_id: str, publish: Publish) -> str:
        """Processes one job; returns the run's resulting status."""
        row = await self.pool.fetchrow("SELECT status FROM runs WHERE run_id = $1", run_id)
        if row is not None and row["status"] in ("running", "completed", "rejected"):
            log.info("run %s already %s; job redelivered, nothing to do", run_id, row["status"])
            return str(row["status"])
        await self.pool.execute(
            "INSERT INTO runs (run_id, name, status, model, grader, spec, dataset_uri)"
            " VALUES ($1, $2, 'validating', $3, $4, $5, $6) ON CONFLICT (run_id) DO NOTHING",
            run_id,
            job.name,
            job.model,
            job.grader,
            encode(job).decode(),
            job.dataset,
        )
        with tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as copy:
            started = time.perf_counter()
            scanned = await self._validate(job, source, copy)
            validated = time.perf_counter()
            if isinstance(scanned, Rejection):
                await self.pool.execute(
                    "UPDATE runs SET status = 'rejected', problems = $2, updated_at = now() WHERE run_id = $1",
                    run_id,
                    scanned.as_json(),
                )
                log.info("run %s rejected: %d problem(s)", run_id, len(scanned.problems))
                return "rejected"
            return await self._publish(job, run_id, scanned, publish, validate_s=validated - started)

    async def _publish(
        self, job: JobSpec, run_id: str, scanned: Scanned, publish: Publish, *, validate_s: float
    ) -> str:
        started = time.perf_counter()
        scan = scanned.scan
        if job.shard_size is None:  # the manifest records the size used, for reproductions
            job = msgspec.structs.replace(job, shard_size=auto_shard_size(scan.items))
        assert job.shard_size is not None
        chunks = plan_chunks(scanned.sizes, job.shard_size, max_chunk_bytes(job))
        stored_uri = await asyncio.to_thread(self._store_dataset, scan, scanned.copy)
        manifest = build_manifest(
            job,
            dataset_uri=stored_uri,
            dataset_sha256=scan.sha256,
            content_sha256=scan.content_sha256,
            dataset_format=scan.format,
            total=scan.items,
            shard_count=len(chunks),
            filename=scan.filename,
        )
        digest = manifest_sha256(manifest)
        await asyncio.to_thread(self._store_manifest, run_id, manifest)
        await self.pool.execute(
            "UPDATE runs SET manifest = $2, manifest_sha256 = $3, dataset_sha256 = $4, total = $5,"
            " shard_count = $6, updated_at = now() WHERE run_id = $1",
            run_id,
            json.dumps(manifest),
            digest,
            scan.content_sha256,
            scan.items,
            len(chunks),
        )
        await self._record_version(scan, stored_uri, run_id, from_store=stored_uri == job.dataset)
        stored = time.perf_counter()
        # Every shard is acknowledged by the broker before the run counts as published; keyed
        # by shard, the run's shards spread over every partition (spread.py).
        await publish_all(ShardMessages(run_id, job, chunks, scanned.copy), publish)
        await self.pool.execute(
            "UPDATE runs SET status = 'running', published_at = now(), updated_at = now()"
            " WHERE run_id = $1 AND status = 'validating'",
            run_id,
        )
        log.info(
            "run %s: %d items in %d shards published (checked in %.2f s, stored in %.2f s, published in %.2f s)",
            run_id,
            scan.items,
            len(chunks),
            validate_s,
            stored - started,
            time.perf_counter() - stored,
        )
        return "running"

    async def reject_undecodable(self, run_id: str, rejected: JobRejected) -> str:
        """Records a job that broke the job contract as a rejected run (the run's problems
        name the fields); a run of that id that already exists is left as it is."""
        problems = Rejection([Problem(line=None, field=f, message=m) for f, m in rejected.problems])

        def text(key: str) -> str:
            value = rejected.job.get(key)
            return value.replace("\x00", "\ufffd") if isinstance(value, str) else ""

        spec = msgspec.json.encode(rejected.job).decode()
        if "\\u0000" in spec:  # PostgreSQL's jsonb refuses NUL: keep the job as text
            spec = json.dumps({"rejected_job": spec.replace("\\u0000", "")})
        status = await self.pool.fetchval(
            "INSERT INTO runs (run_id, name, status, model, grader, spec, dataset_uri, problems)"
            " VALUES ($1, $2, 'rejected', $3, $4, $5, $6, $7) ON CONFLICT (run_id) DO NOTHING"
            " RETURNING status",
            run_id,
            text("name")[:200] or None,
            text("model")[:500],
            text("grader")[:500],
            spec,
            text("dataset")[:2000] or None,
            problems.as_json(),
        )
        if status is None:
            log.warning("job for existing run %s broke the job contract; run left as it is", run_id)
            return "duplicate"
        log.info("run %s rejected: %s", run_id, rejected)
        return "rejected"

    async def _validate(self, job: JobSpec, source: BinaryIO, copy: BinaryIO) -> Scanned | Rejection:
        """The dataset copied into `source` and read once: valid items' JSON go to `copy`."""
        problems = job_problems(job)
        if any(p.field == "job" for p in problems):  # too big to publish in shards: read nothing
            return Rejection(problems)
        try:  # only from the datasets bucket (or DATASET_LOCAL_ROOT), capped in size
            filename = await asyncio.to_thread(
                intake_limits.copy_dataset, job.dataset, self.s3, self.settings, source
            )
        except (OSError, ValueError, storage.S3Error) as exc:
            message = f"cannot read dataset {job.dataset[:200]!r}: {exc}"
            return Rejection([*problems, Problem(line=None, field="dataset", message=message)])
        source.seek(0)
        sizes = array("L")

        def keep(encoded: bytes) -> None:
            copy.write(encoded)
            copy.write(b"\n")
            sizes.append(len(encoded))

        try:
            item_limit = intake_limits.max_item_bytes(job)  # an item and the job share a message
            scan = await asyncio.to_thread(
                scan_dataset,
                source,
                filename,
                max_item_bytes=item_limit,
                sink=keep,
                processes=self.settings.dataset_check_processes,
            )
        except DatasetError as exc:
            return Rejection([*problems, *exc.problems])
        return Rejection(problems) if problems else Scanned(scan, copy, sizes)

    def _store_dataset(self, scan: DatasetScan, copy: BinaryIO) -> str:
        """Content-addressed copy: identical content is stored (and versioned) once."""
        name = f"datasets/{scan.content_sha256}/items.jsonl"
        copy.seek(0, 2)  # put_file uploads up to the current position
        storage.put_file(self.s3, self.settings.s3_bucket_datasets, name, copy, "application/x-ndjson")
        return f"s3://{self.settings.s3_bucket_datasets}/{name}"

    async def _record_version(self, scan: DatasetScan, uri: str, run_id: str, *, from_store: bool) -> None:
        """One row per dataset content: the first run makes it, later ones add file names
        (not the store's own name, when a reproduction reads the stored copy)."""
        await self.pool.execute(
            "INSERT INTO dataset_versions (content_sha256, name, names, items, uri, first_run_id)"
            " VALUES ($1, $2, CASE WHEN $6 THEN '{}'::text[] ELSE ARRAY[$2] END, $3, $4, $5)"
            " ON CONFLICT (content_sha256) DO UPDATE SET names = CASE"
            " WHEN $6 OR $2 = ANY(dataset_versions.names) THEN dataset_versions.names"
            " ELSE dataset_versions.names || $2 END",
            scan.content_sha256,
            scan.filename,
            scan.items,
            uri,
            run_id,
            from_store,
        )

    def _store_manifest(self, run_id: str, manifest: dict[str, object]) -> None:
        body = json.dumps(manifest, indent=2, sort_keys=True).encode()
        storage.put_bytes(
            self.s3,
            self.settings.s3_bucket_results,
            keys.run_object_name(run_id, "manifest.json"),
            body,
            "application/json",
        )
