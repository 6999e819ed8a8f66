"""Job intake: validate the whole dataset, store it and the run manifest, publish shards.

Nothing of a rejected job is published. A job redelivered after a crash (its offset was
not committed) republishes the same deterministic shards; the sinks drop the duplicates.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import asyncpg
import msgspec
from minio import Minio

from evalstream.common import intake_limits, keys, storage
from evalstream.common.contract import JobRejected
from evalstream.common.datasets import DatasetError, LoadedDataset, Problem, load_dataset, write_stored_copy
from evalstream.common.jobs import job_problems
from evalstream.common.manifest import build_manifest, manifest_sha256
from evalstream.common.messages import Item, JobSpec, Shard, encode
from evalstream.common.service import MESSAGE_BUDGET_BYTES
from evalstream.common.settings import ProducerSettings

log = logging.getLogger("evalstream.producer")

# A job that names no shard size: shards of AUTO_SHARD_MIN items, or bigger for a large set
# so that it is cut into about AUTO_SHARDS_PER_RUN, up to AUTO_SHARD_MAX (auto_shard_size).
AUTO_SHARD_MIN, AUTO_SHARD_MAX, AUTO_SHARDS_PER_RUN = 32, 256, 256
PUBLISH_WINDOW = 256  # shards in flight at once while publishing a run

Publish = Callable[[bytes, str], Awaitable[None]]  # (payload, key) -> durable on the broker


@dataclass(frozen=True)
class Rejection:
    problems: list[Problem]

    def as_json(self) -> str:
        return json.dumps(
            [msgspec.to_builtins(p) if isinstance(p, msgspec.Struct) else p.__dict__ for p in self.problems]
        )


def chunk_items(items: list[Item], max_items: int, max_bytes: int) -> list[list[Item]]:
    """Consecutive chunks of at most `max_items` items and about `max_bytes` of JSON each:
    a shard of long items must still fit in one Kafka message."""
    chunks: list[list[Item]] = []
    chunk: list[Item] = []
    size = 0
    for item in items:
        n = len(encode(item))
        if chunk and (len(chunk) >= max_items or size + n > max_bytes):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        chunks.append(chunk)
    return chunks


def auto_shard_size(items: int) -> int:
    """Small sets keep small shards (spread over many workers; progress that moves); a large
    set gets bigger ones, because moving a shard (routing it, committing it, writing its
    Parquet object) costs the same whatever its size: 150,000 items go in shards of 256."""
    return min(AUTO_SHARD_MAX, max(AUTO_SHARD_MIN, -(-items // AUTO_SHARDS_PER_RUN)))


def make_shards(run_id: str, job: JobSpec, items: list[Item]) -> list[Shard]:
    envelope = len(encode(job)) + 1024  # the job's fields travel in every shard
    size = job.shard_size if job.shard_size is not None else auto_shard_size(len(items))
    chunks = chunk_items(items, size, MESSAGE_BUDGET_BYTES - envelope)
    return [
        Shard(
            run_id=run_id,
            shard_id=keys.shard_id(run_id, i),
            shard_index=i,
            shard_count=len(chunks),
            model=job.model,
            grader=job.grader,
            generation=job.generation,
            items=chunk,
            prompt_template=job.prompt_template,
            system_prompt=job.system_prompt,
            retry=job.retry,
            worker_group=job.worker_group,
            sla_fallback=job.sla_fallback,
            bypass_cache=job.bypass_cache,
        )
        for i, chunk in enumerate(chunks)
    ]


async def publish_all(payloads: Iterable[bytes], key: str, publish: Publish) -> None:
    """Publishes in windows of PUBLISH_WINDOW: thousands of sends at once outrun the Kafka
    client's buffer and time out, failing (and redelivering) the whole job. `payloads` may
    be a generator: only one window of encoded shards is held at a time."""
    payloads = iter(payloads)
    while window := list(itertools.islice(payloads, PUBLISH_WINDOW)):
        await asyncio.gather(*(publish(p, key) for p in window))


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
        loaded_or_rejection = await self._validate(job)
        if isinstance(loaded_or_rejection, Rejection):
            await self.pool.execute(
                "UPDATE runs SET status = 'rejected', problems = $2, updated_at = now() WHERE run_id = $1",
                run_id,
                loaded_or_rejection.as_json(),
            )
            log.info("run %s rejected: %d problem(s)", run_id, len(loaded_or_rejection.problems))
            return "rejected"
        loaded = loaded_or_rejection
        if job.shard_size is None:  # the manifest records the size used, for reproductions
            job = msgspec.structs.replace(job, shard_size=auto_shard_size(len(loaded.items)))
        shards = make_shards(run_id, job, loaded.items)
        stored_uri = await asyncio.to_thread(self._store_dataset, loaded, job.dataset)
        manifest = build_manifest(
            job,
            dataset_uri=stored_uri,
            dataset_sha256=loaded.sha256,
            content_sha256=loaded.content_sha256,
            dataset_format=loaded.format,
            total=len(loaded.items),
            shard_count=len(shards),
            filename=loaded.filename,
        )
        digest = manifest_sha256(manifest)
        await asyncio.to_thread(self._store_manifest, run_id, manifest)
        await self.pool.execute(
            "UPDATE runs SET manifest = $2, manifest_sha256 = $3, dataset_sha256 = $4, total = $5,"
            " shard_count = $6, updated_at = now() WHERE run_id = $1",
            run_id,
            json.dumps(manifest),
            digest,
            loaded.content_sha256,
            len(loaded.items),
            len(shards),
        )
        await self._record_version(loaded, stored_uri, run_id, from_store=stored_uri == job.dataset)
        # Every shard is acknowledged by the broker before the run counts as published.
        await publish_all((encode(s) for s in shards), run_id, publish)
        await self.pool.execute(
            "UPDATE runs SET status = 'running', published_at = now(), updated_at = now()"
            " WHERE run_id = $1 AND status = 'validating'",
            run_id,
        )
        log.info("run %s: %d items in %d shards published", run_id, len(loaded.items), len(shards))
        return "running"

    async def reject_undecodable(self, run_id: str, rejected: JobRejected) -> str:
        """Records a job that broke the job contract as a rejected run (the run's problems
        name the fields); a run of that id that already exists is left as it is."""
        problems = Rejection([Problem(line=None, field=f, message=m) for f, m in rejected.problems])

        def text(key: str) -> str:
            value = rejected.job.get(key)
            return value if isinstance(value, str) else ""

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

    async def _validate(self, job: JobSpec) -> LoadedDataset | Rejection:
        problems = job_problems(job)
        if any(p.field == "job" for p in problems):  # too big to publish in shards: read nothing
            return Rejection(problems)
        try:  # only from the datasets bucket (or DATASET_LOCAL_ROOT), capped in size
            data, filename = await asyncio.to_thread(
                intake_limits.read_dataset, job.dataset, self.s3, self.settings
            )
        except (OSError, ValueError, storage.S3Error) as exc:
            return Rejection(
                [
                    *problems,
                    Problem(
                        line=None,
                        field="dataset",
                        message=f"cannot read dataset {job.dataset[:200]!r}: {exc}",
                    ),
                ]
            )
        try:
            item_limit = intake_limits.max_item_bytes(job)  # an item and the job share a message
            loaded = await asyncio.to_thread(load_dataset, data, filename, max_item_bytes=item_limit)
        except DatasetError as exc:
            return Rejection([*problems, *exc.problems])
        return Rejection(problems) if problems else loaded

    def _store_dataset(self, loaded: LoadedDataset, uri: str) -> str:
        """Content-addressed copy: identical content is stored (and versioned) once."""
        name = f"datasets/{loaded.content_sha256}/items.jsonl"
        with tempfile.TemporaryFile() as body:  # on disk, not a second copy of the set in memory
            write_stored_copy(loaded.items, body)
            storage.put_file(self.s3, self.settings.s3_bucket_datasets, name, body, "application/x-ndjson")
        return f"s3://{self.settings.s3_bucket_datasets}/{name}"

    async def _record_version(
        self, loaded: LoadedDataset, uri: str, run_id: str, *, from_store: bool
    ) -> None:
        """One row per dataset content: the first run makes it, later ones add file names
        (not the store's own name, when a reproduction reads the stored copy)."""
        await self.pool.execute(
            "INSERT INTO dataset_versions (content_sha256, name, names, items, uri, first_run_id)"
            " VALUES ($1, $2, CASE WHEN $6 THEN '{}'::text[] ELSE ARRAY[$2] END, $3, $4, $5)"
            " ON CONFLICT (content_sha256) DO UPDATE SET names = CASE"
            " WHEN $6 OR $2 = ANY(dataset_versions.names) THEN dataset_versions.names"
            " ELSE dataset_versions.names || $2 END",
            loaded.content_sha256,
            loaded.filename,
            len(loaded.items),
            uri,
            run_id,
            from_store,
        )

    def _store_manifest(self, run_id: str, manifest: dict[str, object]) -> None:
        body = json.dumps(manifest, indent=2, sort_keys=True).encode()
        storage.put_bytes(
            self.s3, self.settings.s3_bucket_results, f"runs/{run_id}/manifest.json", body, "application/json"
        )
