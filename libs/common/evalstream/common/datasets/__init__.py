"""Datasets: reading (formats.py), the meaning of each record (fields.py), the whole-set
checks in bounded memory (scan.py), and the stored copy. Shared by the producer's intake and
evalctl (which checks a file before uploading it, and reads stored copies for `datasets` and
`reproduce`).

Formats are chosen by extension: JSON Lines (`.jsonl`, `.json`, `.ndjson`), Parquet, CSV
(and TSV). HumanEval files (`task_id, prompt, entry_point, test`) are recognised by their
fields in any of these formats.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import msgspec

from evalstream.common.analysis.questions import normalise
from evalstream.common.datasets.formats import Format
from evalstream.common.datasets.problems import MAX_PROBLEMS_SHOWN, DatasetError, Problem, Unit
from evalstream.common.datasets.scan import (
    DEFAULT_MAX_ITEM_BYTES,
    DatasetScan,
    ItemSink,
    content_sha256,
    legacy_content_sha256,
    scan_dataset,
)
from evalstream.common.messages import Item, decode, encode

__all__ = [
    "DEFAULT_MAX_ITEM_BYTES",
    "MAX_PROBLEMS_SHOWN",
    "DatasetError",
    "DatasetScan",
    "Format",
    "ItemSink",
    "LoadedDataset",
    "Problem",
    "Unit",
    "content_sha256",
    "legacy_content_sha256",
    "load_dataset",
    "load_dataset_file",
    "normalise",
    "read_stored_copy",
    "scan_dataset",
    "write_stored_copy",
]


@dataclass(frozen=True)
class LoadedDataset:
    """A fully validated question set, with its items (see DatasetScan)."""

    items: list[Item]
    format: Format
    sha256: str
    content_sha256: str
    warnings: list[Problem] = field(default_factory=list)
    filename: str = ""

    def __len__(self) -> int:
        return len(self.items)


def load_dataset_file(
    path: str | os.PathLike[str], *, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
) -> LoadedDataset:
    """Reads and validates a local dataset file (see `load_dataset`)."""
    p = Path(path)
    with p.open("rb") as f:
        return load_stream(f, p.name, max_item_bytes=max_item_bytes)


def load_dataset(
    data: bytes, filename: str, *, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
) -> LoadedDataset:
    """Parses and validates a whole dataset, keeping its items; raises DatasetError listing
    every problem."""
    return load_stream(io.BytesIO(data), filename, max_item_bytes=max_item_bytes)


def load_stream(
    stream: BinaryIO, filename: str, *, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
) -> LoadedDataset:
    items: list[Item] = []
    scan = scan_dataset(
        stream, filename, max_item_bytes=max_item_bytes, sink=lambda encoded: items.append(_item(encoded))
    )
    return LoadedDataset(
        items=items,
        format=scan.format,
        sha256=scan.sha256,
        content_sha256=scan.content_sha256,
        warnings=scan.warnings,
        filename=filename,
    )


_item = msgspec.json.Decoder(Item).decode  # JSON the scan made from a checked item


def read_stored_copy(data: bytes) -> list[Item]:
    """The items of a stored copy (JSONL of items, as write_stored_copy and the producer
    write it), each line decoded as an item under the item size limit. Not checked again
    as a dataset: the reader compares their content hash with the one recorded when the set
    was checked (regrading.stored_items), which only the items checked then have, so a copy
    stored under older rules still reads. Raises ValueError for a line that is no item."""
    items = []
    for lineno, line in enumerate(io.BytesIO(data), start=1):
        if not line.strip():
            continue
        try:
            items.append(decode(line, Item, max_bytes=DEFAULT_MAX_ITEM_BYTES))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"line {lineno} is not an item: {exc}") from None
    return items


def write_stored_copy(items: Iterable[Item], out: BinaryIO) -> None:
    """The dataset as stored in S3 (and read back by reproductions): JSONL of the items,
    which loads back to the same content hash."""
    for item in items:
        out.write(encode(item))
        out.write(b"\n")
