"""What a job may ask of the producer: where its dataset is read from, how big the dataset
and the job may be, and which names may travel into S3 keys and topic names.

A job is untrusted (any Kafka client may publish one). It names its dataset, but the
producer reads only objects of the datasets bucket (where `evalctl submit` uploads), or
regular files under DATASET_LOCAL_ROOT when an operator set one (unset by default): never
/dev/zero, /etc/passwd or a path that only probes whether a file exists. Every read is
capped at DATASET_MAX_BYTES. The job itself travels in every shard, so it must leave room
in a Kafka message for the items; run ids and worker group names become S3 keys and topic
names, so they are plain names.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import BinaryIO

from minio import Minio
from minio.error import S3Error

from evalstream.common import storage
from evalstream.common.messages import MESSAGE_BUDGET_BYTES, JobSpec, encode
from evalstream.common.names import plain_name_problem
from evalstream.common.settings import ProducerSettings

MAX_JOB_BYTES = 64 * 1024  # prompt template, system prompt, specs, name: far less in practice
SHARD_OVERHEAD_BYTES = 2048  # a shard's own fields beside the job's and its items
MAX_NAME_CHARS = 200  # a run's display name


class DatasetSourceError(ValueError):
    """The job's dataset cannot be read from where it says: the message says why."""


def job_limit_problems(job: JobSpec) -> list[tuple[str, str]]:
    """(field, message) for each limit the job breaks."""
    out: list[tuple[str, str]] = []
    size = len(encode(job))
    if size > MAX_JOB_BYTES:
        out.append(("job", f"the job is {size} bytes as JSON, over the {MAX_JOB_BYTES}-byte limit"))
    for field, value in (("run_id", job.run_id), ("worker_group", job.worker_group)):
        if value is not None and (problem := plain_name_problem(value, field)):
            out.append((field, problem))
    if job.name is not None and (len(job.name) > MAX_NAME_CHARS or not job.name.isprintable()):
        out.append(("name", f"name must be at most {MAX_NAME_CHARS} printable characters"))
    return out


def max_item_bytes(job: JobSpec) -> int:
    """The largest item that still fits in a shard message beside this job's fields."""
    return MESSAGE_BUDGET_BYTES - len(encode(job)) - SHARD_OVERHEAD_BYTES


def read_dataset(uri: str, s3: Minio, settings: ProducerSettings) -> tuple[bytes, str]:
    """The dataset's bytes and file name (copy_dataset into memory). Raises DatasetSourceError."""
    out = io.BytesIO()
    name = copy_dataset(uri, s3, settings, out)
    return out.getvalue(), name


def copy_dataset(uri: str, s3: Minio, settings: ProducerSettings, out: BinaryIO) -> str:
    """Copies the dataset into `out` (a file: a set of any size costs no memory); returns
    its file name. Raises DatasetSourceError."""
    if uri.startswith("s3://"):
        return _copy_object(uri, s3, settings, out)
    return _copy_local(uri, settings, out)


def _copy_object(uri: str, s3: Minio, settings: ProducerSettings, out: BinaryIO) -> str:
    bucket, key = storage.parse_s3_uri(uri)
    if bucket != settings.s3_bucket_datasets:
        raise DatasetSourceError(
            f"datasets are read from the bucket {settings.s3_bucket_datasets!r} only, not {bucket!r}"
        )
    limit = settings.dataset_max_bytes
    try:
        size = s3.stat_object(bucket, key).size or 0
        if size > limit:
            raise DatasetSourceError(f"the dataset is {size} bytes, over the {limit}-byte limit")
        copied = storage.get_into(s3, bucket, key, out, max_bytes=limit)
    except S3Error as exc:
        raise DatasetSourceError(f"cannot read {uri}: {exc.code}") from exc
    if copied > limit:
        raise DatasetSourceError(f"the dataset is over the {limit}-byte limit")
    return os.path.basename(key)


def _copy_local(path: str, settings: ProducerSettings, out: BinaryIO) -> str:
    if not settings.dataset_local_root:
        bucket = settings.s3_bucket_datasets
        raise DatasetSourceError(
            f"jobs read datasets from s3://{bucket}/ (`evalctl submit` uploads local files there);"
            " this producer reads no local files (DATASET_LOCAL_ROOT is not set)"
        )
    root = Path(settings.dataset_local_root).resolve()
    # resolved: no "..", no symlink leads out of the root
    target = (root / path).resolve() if not os.path.isabs(path) else Path(path).resolve()
    if not target.is_relative_to(root):
        raise DatasetSourceError(f"local datasets are read only under {root}")
    limit = settings.dataset_max_bytes
    try:
        # O_NOFOLLOW|O_NONBLOCK: the resolved path is opened as is, and a FIFO cannot block us
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise DatasetSourceError(f"cannot read {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise DatasetSourceError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise DatasetSourceError(f"the dataset is {info.st_size} bytes, over the {limit}-byte limit")
        copied = 0
        while copied <= limit and (chunk := f.read(min(1 << 20, limit + 1 - copied))):
            out.write(chunk)
            copied += len(chunk)
    if copied > limit:
        raise DatasetSourceError(f"the dataset is over the {limit}-byte limit")
    return target.name
