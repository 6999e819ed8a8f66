"""One pass over a whole dataset, in memory that does not grow with its items' text: every
record read (formats.py) and checked (fields.py), then the checks of the set as a whole.

A run must never start on a question set that turns out to be broken half-way through, so
the producer reads and validates the *whole* file before it publishes a single shard, and
reports every problem at once (with line numbers) so the user can fix the file in one go.

The set-wide checks keep a few fixed-size numbers per item (an 8-byte hash of its id, a
32-byte digest of its content, a 28-byte key of its question and answer), never the items:
150,000 items cost about 10 MB whatever their length. A hash match is confirmed on the
items' own text by reading the few lines concerned again, so a collision can never raise a
false problem. Items themselves go to `sink` as they are read (the producer writes them to
its stored copy; `load_dataset` keeps them in a list for callers that want them all).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from hashlib import blake2b, sha256
from typing import Any, BinaryIO

import msgspec
import numpy as np

from evalstream.common.analysis.questions import normalise, question_key, question_key_digest
from evalstream.common.datasets.fields import (
    GENERIC_FIELDS,
    HUMANEVAL_FIELDS,
    Fields,
    check_columns,
    quiet_id,
)
from evalstream.common.datasets.formats import Format, open_records
from evalstream.common.datasets.problems import DatasetError, Problem, Report, by_line
from evalstream.common.messages import Item, encode

DEFAULT_MAX_ITEM_BYTES = 900_000  # an item must fit in a shard message (Kafka's 1 MiB)
MAX_UNKNOWN_FIELDS = 100  # distinct unknown field names reported (one warning each)
MAX_CONFLICT_WARNINGS = 1000  # repeated questions with different answers, reported one by one

ItemSink = Callable[[bytes], None]  # an item's JSON, as stored and published
PARALLEL_MIN_BYTES = 4 * 1024 * 1024  # smaller: one process (starting children costs more)


@dataclass(frozen=True)
class DatasetScan:
    """A fully validated question set, without its items.

    `sha256` identifies the exact bytes (what was uploaded); `content_sha256` identifies the
    questions and gold labels regardless of order and file format, so that a converted or
    shuffled copy of the same set is recognisably the same benchmark."""

    format: Format
    sha256: str
    content_sha256: str
    items: int
    warnings: list[Problem]
    filename: str


_CANONICAL = msgspec.json.Encoder(order="sorted")


def canonical(item: Item) -> bytes:
    """The item's JSON with keys sorted and defaults omitted: the same for any file format."""
    return _CANONICAL.encode(item)


def item_digest(item: Item) -> bytes:
    return sha256(_CANONICAL.encode(item)).digest()


def content_sha256(items: Any) -> str:
    """Order- and format-independent hash of a set of items: sha256 over the sorted sha256
    digests of their canonical JSON."""
    return _digest_of_digests(b"".join(item_digest(i) for i in items))


def legacy_content_sha256(items: Any) -> str:
    """The content hash of manifests written before version 2 of it (sha256 over the sorted
    canonical JSON of the items, one per line): stored copies of older runs still check."""
    h = hashlib.sha256()
    for encoded in sorted(canonical(item) for item in items):
        h.update(encoded)
        h.update(b"\n")
    return h.hexdigest()


def _digest_of_digests(digests: bytes | bytearray) -> str:
    """Sorted in place when `digests` is a bytearray (the scan's: no copy of 32 bytes per item)."""
    ordered = np.frombuffer(digests if isinstance(digests, bytearray) else bytearray(digests), dtype="S32")
    ordered.sort()
    return hashlib.sha256(ordered.data).hexdigest()


def _hash64(text: str) -> bytes:
    """8 bytes of the text's hash, kept in a bytearray and read as little-endian uint64."""
    return blake2b(text.encode(), digest_size=8).digest()


def _uint64s(hashes: bytearray) -> np.ndarray:
    return np.frombuffer(hashes, dtype="<u8")


class _SetChecks:
    """What the set-wide checks keep per item: fixed-size numbers, in arrays."""

    def __init__(self) -> None:
        self.id_hashes = bytearray()  # 8 bytes each (_hash64)
        self.id_lines = array("I")  # line numbers: 4 bytes (a dataset is capped far below 2**32 lines)
        self.digests = bytearray()
        self.questions = bytearray()  # 16-byte question keys of answered items
        self.answers = bytearray()  # 8-byte hash of each one's normalised answer
        self.answer_lines = array("I")
        self.unknown: dict[str, tuple[int, int]] = {}  # field -> (first line, count)
        self.unknown_more = 0  # records with fields past MAX_UNKNOWN_FIELDS names

    def record(self, line: int, record: dict[str, Any], known: frozenset[str]) -> None:
        if not record.keys() <= known:  # the usual record: every field known (at C speed)
            self.unknown_names(line, [name for name in record if name not in known])

    def unknown_names(self, line: int, names: list[str]) -> None:
        for name in names:
            if name in self.unknown:
                first, count = self.unknown[name]
                self.unknown[name] = (first, count + 1)
            elif len(self.unknown) < MAX_UNKNOWN_FIELDS:
                self.unknown[name] = (line, 1)
            else:
                self.unknown_more += 1

    def item_id(self, item_id: str, line: int) -> None:
        self.id_hashes += _hash64(item_id)
        self.id_lines.append(line)

    def item(self, line: int, item: Item) -> None:
        self.digests += item_digest(item)
        if item.answer is not None:
            self.questions += question_key_digest(item)
            self.answers += _hash64(normalise(item.answer))
            self.answer_lines.append(line)

    def extend(self, part: Part) -> None:
        """The checks of the file's next block of lines, made by a child process."""
        self.id_hashes += part.checks.id_hashes
        self.id_lines += part.checks.id_lines
        self.digests += part.checks.digests
        self.questions += part.checks.questions
        self.answers += part.checks.answers
        self.answer_lines += part.checks.answer_lines
        for line, names in part.checks.unknown_by_line:  # in file order, as one pass counts them
            self.unknown_names(line, names)

    def duplicate_id_lines(self) -> list[int]:
        """Lines whose id hash is shared with another line (candidates, to confirm)."""
        hashes = _uint64s(self.id_hashes)
        if len(hashes) < 2:
            return []
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        same = ordered[1:] == ordered[:-1]
        shared = np.zeros(len(hashes), dtype=bool)
        shared[1:] |= same
        shared[:-1] |= same
        lines = np.frombuffer(self.id_lines, dtype=np.uint32 if self.id_lines.itemsize == 4 else np.uint64)
        return sorted(int(x) for x in lines[order[shared]])

    def conflicts(self) -> list[tuple[int, int]]:
        """(first line, later line) of items that ask the same question (by key) with a
        different answer (by hash), the later one compared with the first; in file order.
        Computed on views of the arrays and a few 8-byte columns, freed as they are done
        with: the peak is about 25 bytes per item."""
        n = len(self.answer_lines)
        if n < 2:
            return []
        keys = np.frombuffer(self.questions, dtype="S16")
        order = np.argsort(keys, kind="stable")  # stable: file order within a question
        ordered_keys = keys[order]
        first_index = np.arange(n)
        first_index[1:][ordered_keys[1:] == ordered_keys[:-1]] = 0  # 0 unless a question starts
        del ordered_keys
        np.maximum.accumulate(first_index, out=first_index)  # -> where its question starts
        answers = _uint64s(self.answers)[order]
        differs = np.nonzero(answers != answers[first_index])[0]
        del answers
        lines = np.frombuffer(
            self.answer_lines, dtype=np.uint32 if self.answer_lines.itemsize == 4 else np.uint64
        )
        pairs = [(int(lines[order[first_index[i]]]), int(lines[order[i]])) for i in differs]
        return sorted(pairs, key=lambda p: p[1])


def _sha256_of(stream: BinaryIO) -> str:
    start = stream.tell()
    digest = hashlib.file_digest(stream, "sha256").hexdigest()  # type: ignore[arg-type]
    stream.seek(start)
    return digest


class PartChecks(_SetChecks):
    """A child process's set checks on its block of lines (parts.py): the unknown field
    names are kept per record, for the parent to count in file order as one pass would."""

    def __init__(self) -> None:
        super().__init__()
        self.unknown_by_line: list[tuple[int, list[str]]] = []

    def unknown_names(self, line: int, names: list[str]) -> None:
        if names:
            self.unknown_by_line.append((line, names))


@dataclass(frozen=True)
class Part:
    """What a child process found in its block of lines (parts.py)."""

    problems: list[Problem]
    warnings: list[Problem]
    checks: PartChecks
    count: int
    items: list[tuple[int, bytes]]  # (line, the item's JSON) of its valid items, when wanted


class Scanner:
    """The checks of each record, in file order: scan_dataset's loop, or a child process's
    block of it (parts.py)."""

    def __init__(
        self, report: Report, humaneval: bool, max_item_bytes: int, checks: _SetChecks | None = None
    ) -> None:
        self.report = report
        self.fields = Fields(report)
        self.checks = checks if checks is not None else _SetChecks()
        self.humaneval = humaneval
        self.known = HUMANEVAL_FIELDS if humaneval else GENERIC_FIELDS
        self.id_field = "task_id" if humaneval else "id"
        self.max_item_bytes = max_item_bytes
        self.count = 0

    def record(self, line: int, record: dict[str, Any]) -> bytes | None:
        """The record's item as JSON, or None when it is no valid item (reported)."""
        self.checks.record(line, record, self.known)
        item_id = self.fields.item_id(line, record, self.id_field)
        if item_id is not None:  # checked even when the rest is bad: both problems show
            self.checks.item_id(item_id, line)
        item = self.fields.item(line, record, humaneval=self.humaneval)
        if item is None or item_id is None:
            return None
        encoded = encode(item)
        if len(encoded) > self.max_item_bytes:
            self.report.problem(
                line,
                None,
                f"item {item.id!r} is {len(encoded)} bytes as JSON, over the {self.max_item_bytes}-byte limit "
                "for one Kafka message",
            )
            return None
        self.checks.item(line, item)
        self.count += 1
        return encoded


def scan_dataset(
    stream: BinaryIO,
    filename: str,
    *,
    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
    sink: ItemSink | None = None,
    processes: int = 1,
) -> DatasetScan:
    """Reads and validates the whole dataset in `stream` (seekable; read from its start);
    each valid item's JSON goes to `sink`, in file order, while no problem has been found.
    Raises DatasetError listing every problem. With `processes` > 1, a JSON Lines file of
    PARALLEL_MIN_BYTES or more is checked by that many child processes, a block of lines
    each at a time (parts.py): the same problems, warnings, hashes and items, sooner. The
    children are spawned (fresh interpreters that import the caller's `__main__` again): a
    script that asks for them runs its work under `if __name__ == "__main__":`."""
    report = Report()
    sha256 = _sha256_of(stream)
    start = stream.tell()
    size = stream.seek(0, 2) - start
    stream.seek(start)
    opened = open_records(stream, filename, report)
    if opened is not None and not check_columns(report, opened):
        opened = None
    scanner: Scanner | None = None
    if opened is not None:
        scanner = Scanner(report, opened.humaneval, max_item_bytes)
        jsonl = opened.columns is None  # JSON Lines (HumanEval's or not); tables have a header
        if processes > 1 and jsonl and size >= PARALLEL_MIN_BYTES:
            from evalstream.common.datasets import parts  # process pools: only for large files

            parts.scan_in_parts(stream, opened.records, scanner, sink, processes)
        else:
            for line, record in opened.records:
                encoded = scanner.record(line, record)
                if encoded is not None and sink is not None and not report.problems:
                    sink(encoded)
    checks = scanner.checks if scanner is not None else _SetChecks()
    count = scanner.count if scanner is not None else 0
    if opened is not None:
        _confirm_duplicates(stream, filename, report, checks.duplicate_id_lines(), opened.humaneval)
    if not report.problems and count == 0:
        report.problem(None, None, "dataset is empty")
    if report.problems:
        raise DatasetError(by_line(report.problems), filename)
    _conflict_warnings(stream, filename, report, checks.conflicts())
    warnings = [
        Problem(
            first,
            name,
            f'unknown field "{name}" ignored ({n} {report.unit}{"s" if n > 1 else ""})',
            report.unit,
        )
        for name, (first, n) in checks.unknown.items()
    ]
    if checks.unknown_more:
        warnings.append(
            Problem(
                None,
                None,
                f"{checks.unknown_more} more unknown fields ignored (only {MAX_UNKNOWN_FIELDS} named)",
            )
        )
    assert opened is not None
    return DatasetScan(
        format=opened.format,
        sha256=sha256,
        content_sha256=_digest_of_digests(checks.digests),
        items=count,
        warnings=by_line(warnings + report.warnings),
        filename=filename,
    )


def _records_at(stream: BinaryIO, filename: str, lines: set[int]) -> dict[int, dict[str, Any]]:
    """The records on `lines`, read again (the rare path: only lines a hash pointed at)."""
    stream.seek(0)
    opened = open_records(stream, filename, Report())
    if opened is None:
        return {}
    out = {}
    for line, record in opened.records:
        if line in lines:
            out[line] = record
            if len(out) == len(lines):
                break
    return out


def _confirm_duplicates(
    stream: BinaryIO, filename: str, report: Report, candidates: list[int], humaneval: bool
) -> None:
    """A duplicate id on its later lines, named with the line of its first use."""
    if not candidates:
        return
    records = _records_at(stream, filename, set(candidates))
    first_line: dict[str, int] = {}
    for line in candidates:
        item_id = quiet_id(records.get(line, {}), "task_id" if humaneval else "id")
        if item_id is None:
            continue
        if item_id in first_line:
            report.problem(
                line, "id", f'duplicate id "{item_id}" (first on {report.unit} {first_line[item_id]})'
            )
        else:
            first_line[item_id] = line


def _conflict_warnings(stream: BinaryIO, filename: str, report: Report, pairs: list[tuple[int, int]]) -> None:
    """The same question with two different gold answers is almost always a labelling
    mistake that would cap accuracy below 100 %; worth a warning, not a refusal."""
    if not pairs:
        return
    shown = pairs[:MAX_CONFLICT_WARNINGS]
    records = _records_at(stream, filename, {line for pair in shown for line in pair})
    fields = Fields(Report())
    items: dict[int, Item | None] = {}
    for line, record in records.items():
        items[line] = fields.item(line, record, humaneval=False)
    confirmed = 0
    for first_line, line in shown:
        first, item = items.get(first_line), items.get(line)
        if first is None or item is None or first.answer is None or item.answer is None:
            continue
        if question_key(first) != question_key(item) or normalise(first.answer) == normalise(item.answer):
            continue  # a hash collision, not a conflict
        confirmed += 1
        report.warning(
            line,
            "answer",
            f'"{item.id}" repeats the question of "{first.id}" ({report.unit} {first_line}) '
            f"with a different answer: {item.answer!r} vs {first.answer!r}",
        )
    if len(pairs) > len(shown):
        report.warning(
            None, "answer", f"{len(pairs) - len(shown)} more repeated questions with a different answer"
        )
