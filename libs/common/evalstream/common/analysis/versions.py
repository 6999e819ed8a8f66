"""Dataset versions: naming one (a file, or a content hash prefix of a version the producer
recorded) and what changed between two.

A version is a dataset's content (`content_sha256`: the items, whatever their order or file
format), so the same questions under another file name are the same version and a changed
gold label is a new one. The producer records every version it sees in the
`dataset_versions` table, with its content-addressed copy in S3.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from evalstream.common import storage
from evalstream.common.analysis import queries
from evalstream.common.messages import Item
from evalstream.common.regrading import StoredCopyError, stored_items
from evalstream.common.settings import Settings

_HEX = re.compile(r"[0-9a-f]{4,64}")
_DIFF_FIELDS = ("question", "messages", "answer", "choices", "category", "entry_point", "test", "meta")


@dataclass(frozen=True)
class Dataset:
    content_sha256: str
    items: list[Item]
    label: str  # the file the user named, or the name the version was first submitted as


class DatasetRefError(LookupError):
    pass


# --------------------------------------------------------------------------- pure


def diff_items(a: Sequence[Item], b: Sequence[Item]) -> dict[str, Any]:
    """What changed from version A to version B, item by item (matched by id)."""
    by_a, by_b = {i.id: i for i in a}, {i.id: i for i in b}
    common = sorted(by_a.keys() & by_b.keys())
    changed: dict[str, list[dict[str, Any]]] = {"question": [], "answer": [], "other": []}
    for item_id in common:
        x, y = msgspec.to_builtins(by_a[item_id]), msgspec.to_builtins(by_b[item_id])
        fields = [f for f in _DIFF_FIELDS if x.get(f) != y.get(f)]
        if not fields:
            continue
        entry = {
            "id": item_id,
            "fields": fields,
            "a": {f: x.get(f) for f in fields},
            "b": {f: y.get(f) for f in fields},
        }
        if "question" in fields or "messages" in fields:
            changed["question"].append(entry)
        if "answer" in fields:
            changed["answer"].append(entry)
        if not {"question", "messages", "answer"} & set(fields):
            changed["other"].append(entry)
    return {
        "added": sorted(by_b.keys() - by_a.keys()),
        "removed": sorted(by_a.keys() - by_b.keys()),
        "question_changed": changed["question"],
        "answer_changed": changed["answer"],
        "other_changed": changed["other"],
        "unchanged": len(common) - len({e["id"] for v in changed.values() for e in v}),
    }


# --------------------------------------------------------------------------- resolving


def read_items(data: bytes, filename: str) -> tuple[str, list[Item]]:
    """(content_sha256, items) of a dataset file's bytes, validated as the producer does."""
    from evalstream.common.datasets import load_dataset

    loaded = load_dataset(data, filename)
    return loaded.content_sha256, loaded.items


async def resolve_version(conn: asyncpg.Connection, ref: str) -> asyncpg.Record:
    """The dataset_versions row whose content hash starts with `ref`."""
    rows = await conn.fetch(
        "SELECT * FROM dataset_versions WHERE content_sha256 LIKE $1 || '%' ORDER BY created_at LIMIT 5",
        ref.lower(),
    )
    if not rows:
        raise DatasetRefError(f"no dataset version {ref!r} (see `evalctl datasets list`), and no such file")
    if len(rows) > 1:
        shown = ", ".join(r["content_sha256"][:12] for r in rows)
        raise DatasetRefError(f"dataset version prefix {ref!r} is ambiguous: {shown}")
    return rows[0]


async def load_ref(conn: asyncpg.Connection, settings: Settings, ref: str) -> Dataset:
    """A dataset named by a file path or a version's content hash (prefix)."""
    from evalstream.common.datasets import DatasetError

    path = Path(ref)
    try:
        if await asyncio.to_thread(path.is_file):
            data = await asyncio.to_thread(path.read_bytes)
            digest, items = await asyncio.to_thread(read_items, data, path.name)
            return Dataset(digest, items, str(path))
        if not _HEX.fullmatch(ref.lower()):
            raise DatasetRefError(f"{ref!r} is neither a file nor a dataset version (content hash)")
        row = await resolve_version(conn, ref)
        s3 = storage.client(settings)
        items = await asyncio.to_thread(stored_items, s3, row["uri"], row["content_sha256"])
    except DatasetError as exc:
        raise DatasetRefError(f"{ref}: {exc}") from exc
    except StoredCopyError as exc:
        raise DatasetRefError(f"version {row['content_sha256'][:12]}: {exc}") from exc
    return Dataset(row["content_sha256"], items, row["name"])


async def list_versions(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every version, oldest first per name, numbered per name (v1, v2, ...)."""
    rows = await conn.fetch(
        "SELECT v.*, row_number() OVER (PARTITION BY v.name ORDER BY v.created_at, v.content_sha256) AS version"
        " FROM dataset_versions v ORDER BY v.name, v.created_at, v.content_sha256"
    )
    runs = await queries.runs_per_dataset(conn)
    return [
        {
            "content_sha256": r["content_sha256"],
            "name": r["name"],
            "version": r["version"],
            "names": list(r["names"]),
            "items": r["items"],
            "runs": runs.get(r["content_sha256"], 0),
            "first_run_id": r["first_run_id"],
            "created_at": r["created_at"].isoformat(),
            "uri": r["uri"],
        }
        for r in rows
    ]
