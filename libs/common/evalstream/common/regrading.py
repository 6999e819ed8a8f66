"""Reading a finished run back: its items from the stored dataset copy (`evalctl reproduce`,
`evalctl regrade`, `evalctl datasets`, the aggregator's regrades), and the manifest of a
regrade of it.

A regrade is a new run: the original's manifest with the grader replaced and a `regrade_of`
section naming the original run, its manifest hash and grader (its grades depend on the
original's answers, so they are part of what is hashed).
"""

from __future__ import annotations

import json
from typing import Any

from minio import Minio

from evalstream.common import storage
from evalstream.common.datasets import content_sha256 as content_hash
from evalstream.common.datasets import legacy_content_sha256, read_stored_copy
from evalstream.common.graders import grader_version
from evalstream.common.manifest import Request
from evalstream.common.messages import Item


class StoredCopyError(Exception):
    """The run's dataset copy is gone, unreadable or not what the run read."""


def stored_items(s3: Minio, uri: str, content_sha256: str) -> list[Item]:
    """The items (gold answers, tests) of the content-addressed dataset copy at `uri`,
    checked against the content hash a run or dataset version recorded. Blocking (S3)."""
    try:
        bucket, key = storage.parse_s3_uri(uri)
        data = storage.get_bytes(s3, bucket, key)
    except ValueError as exc:
        raise StoredCopyError(f"dataset copy: {exc}") from exc
    except storage.S3Error as exc:
        raise StoredCopyError(f"the dataset copy {uri} is no longer available ({exc.code})") from exc
    return copy_items(data, uri, content_sha256)


def copy_items(data: bytes, uri: str, content_sha256: str) -> list[Item]:
    """The items of the dataset copy `data` (read from `uri`), if they are the ones whose
    content hash a run or dataset version recorded; else StoredCopyError."""
    try:
        items = read_stored_copy(data)
    except ValueError as exc:
        raise StoredCopyError(f"the dataset copy {uri} no longer reads: {exc}") from exc
    # the items checked at submission, exactly, or a StoredCopyError (read_stored_copy); a
    # manifest from before the content hash's version 2 names the older hash
    found = content_hash(items)
    if found != content_sha256 and legacy_content_sha256(items) != content_sha256:
        raise StoredCopyError(
            f"the dataset copy {uri} changed: content {found[:12]}, it was {content_sha256[:12]}"
        )
    return items


def run_items(s3: Minio, req: Request) -> list[Item]:
    """A run's items, from the dataset copy its manifest names (`req`). Blocking (S3)."""
    return stored_items(s3, req.dataset_uri, req.content_sha256)


def regraded_manifest(
    manifest: dict[str, Any], run_id: str, digest: str | None, grader: str
) -> dict[str, Any]:
    """The original manifest with the new grader and what it regrades."""
    out = json.loads(json.dumps(manifest))  # deep copy
    original_grader = out["grader"]["name"] if isinstance(out.get("grader"), dict) else out.get("grader")
    if isinstance(out.get("grader"), dict):  # manifest_version >= 2
        out["grader"] = {"name": grader, "version": grader_version(grader)}
    else:
        out["grader"] = grader
    out["regrade_of"] = {"run_id": run_id, "manifest_sha256": digest, "grader": original_grader}
    return out
