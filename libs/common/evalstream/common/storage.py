"""The S3 object store (SeaweedFS locally, any S3 server in production) through the
`minio` client. The client is synchronous: async callers wrap calls in asyncio.to_thread."""

from __future__ import annotations

import io
from typing import BinaryIO
from urllib.parse import urlparse

from minio import Minio
from minio.error import S3Error

from evalstream.common.settings import S3Settings


def client(settings: S3Settings) -> Minio:
    url = urlparse(settings.s3_endpoint)
    return Minio(
        url.netloc,
        access_key=settings.s3_access_key,
        secret_key=settings.s3_secret_key,
        region=settings.s3_region,
        secure=url.scheme == "https",
    )


def ensure_buckets(settings: S3Settings) -> list[str]:
    s3 = client(settings)
    made = []
    for bucket in (settings.s3_bucket_datasets, settings.s3_bucket_results):
        if not s3.bucket_exists(bucket):
            try:
                s3.make_bucket(bucket)
                made.append(bucket)
            except S3Error as exc:  # created concurrently by another service
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
    return made


def put_bytes(s3: Minio, bucket: str, name: str, data: bytes, content_type: str) -> None:
    s3.put_object(bucket, name, io.BytesIO(data), len(data), content_type=content_type)


def put_file(s3: Minio, bucket: str, name: str, f: BinaryIO, content_type: str) -> None:
    """Uploads an open file from its start to its current position (multipart when large)."""
    size = f.tell()
    f.seek(0)
    s3.put_object(bucket, name, f, size, content_type=content_type)


def get_bytes(s3: Minio, bucket: str, name: str, *, max_bytes: int | None = None) -> bytes:
    """The object's bytes (at most `max_bytes` of them)."""
    resp = s3.get_object(bucket, name)
    try:
        return resp.read(max_bytes)
    finally:
        resp.close()
        resp.release_conn()


def get_into(s3: Minio, bucket: str, name: str, out: BinaryIO, *, max_bytes: int) -> int:
    """Copies the object into `out` (at most `max_bytes` + 1 bytes, so that the caller can
    tell a larger object); returns the bytes copied."""
    resp = s3.get_object(bucket, name)
    copied = 0
    try:
        while copied <= max_bytes and (chunk := resp.read(min(1 << 20, max_bytes + 1 - copied))):
            out.write(chunk)
            copied += len(chunk)
    finally:
        resp.close()
        resp.release_conn()
    return copied


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/key -> (bucket, key)."""
    url = urlparse(uri)
    if url.scheme != "s3" or not url.netloc or not url.path.strip("/"):
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    return url.netloc, url.path.lstrip("/")
