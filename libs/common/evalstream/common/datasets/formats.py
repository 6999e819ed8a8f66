"""Reading a dataset file into records (line or row number, dict), one at a time.

Formats are chosen by extension: JSON Lines (`.jsonl`, `.json`, `.ndjson`), Parquet, CSV
(and TSV). A reader never holds more than one record (one Parquet batch) beside what it
yields, so a file of any length is read in bounded memory. What cannot be read is reported
on the Report with its line; what each record and a table's columns *mean* (which are
required, `fields.check_columns`) is fields.py's business: a reader never validates.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import msgspec

from evalstream.common.datasets.problems import Report, type_name
from evalstream.common.jsonlimits import MAX_DEPTH, shape_problem

Format = Literal["jsonl", "parquet", "csv", "humaneval"]
Records = Iterator[tuple[int, dict[str, Any]]]

JSONL_EXTS = {".jsonl", ".json", ".ndjson"}
CSV_EXTS = {".csv": ",", ".tsv": "\t"}
PARQUET_EXTS = {".parquet", ".pq"}
# CSV cells are text; these columns hold JSON.
CSV_JSON_COLUMNS = frozenset({"messages", "choices", "meta"})
HUMANEVAL_REQUIRED = ("task_id", "prompt", "entry_point", "test")
_BOM = b"\xef\xbb\xbf"
MAX_LINE_BYTES = 16 * 1024 * 1024  # one record; an item must also fit a Kafka message (scan.py)


class Invalid:
    """Marks a CSV cell already reported as bad JSON, so it is not reported twice."""


INVALID: Any = Invalid()


@dataclass(frozen=True)
class Opened:
    """A file's records, once its format (and, for tables, its columns) checked out."""

    format: Format
    humaneval: bool
    records: Records
    # a table's header (CSV, Parquet), checked by fields.check_columns before any row is read;
    # header_line: the header's line (CSV: 1; Parquet: None)
    columns: list[str] | None = None
    header_line: int | None = None


def is_humaneval(names: list[str] | set[str] | Any) -> bool:
    names = set(names)
    return set(HUMANEVAL_REQUIRED) <= names and "id" not in names


def known_extension(filename: str) -> bool:
    ext = os.path.splitext(filename)[1].lower()
    return ext in JSONL_EXTS or ext in CSV_EXTS or ext in PARQUET_EXTS


def open_records(stream: BinaryIO, filename: str, report: Report) -> Opened | None:
    """The records of `stream` (read from its current position, which must be its start),
    or None when the file cannot be read at all (reported). An empty file gives no records."""
    ext = os.path.splitext(filename)[1].lower()
    if ext in JSONL_EXTS:
        return _jsonl(stream, report, allow_array_hint=ext == ".json")
    if ext in CSV_EXTS:
        return _csv(stream, report, delimiter=CSV_EXTS[ext])
    if ext in PARQUET_EXTS:
        return _parquet(stream, report)
    known = ", ".join(sorted(JSONL_EXTS | set(CSV_EXTS) | PARQUET_EXTS))
    report.problem(None, None, f"unsupported file extension {ext or '(none)'} (expected one of {known})")
    return None


def _skip_bom(stream: BinaryIO) -> None:
    start = stream.tell()
    if stream.read(len(_BOM)) != _BOM:
        stream.seek(start)


# --------------------------------------------------------------------------- JSON Lines


def _jsonl(stream: BinaryIO, report: Report, *, allow_array_hint: bool) -> Opened | None:
    _skip_bom(stream)
    start = stream.tell()
    head = stream.read(4096).lstrip()
    stream.seek(start)
    if allow_array_hint and head[:1] == b"[":
        report.problem(
            None, None, "a JSON array is not supported: give one JSON object per line (JSON Lines)"
        )
        return None
    records = jsonl_records(stream, report)
    first = next(records, None)
    if first is None:
        return Opened("jsonl", False, iter(()))
    humaneval = is_humaneval(first[1].keys())

    def chained() -> Records:
        yield first
        yield from records

    return Opened("humaneval" if humaneval else "jsonl", humaneval, chained())


def jsonl_records(stream: BinaryIO, report: Report, first_line: int = 1) -> Records:
    """The JSON objects of `stream`'s lines, numbered from `first_line` (a block of a file
    starts further in: datasets/parts.py); what cannot be one is reported."""
    decode = msgspec.json.Decoder().decode
    for lineno, raw in enumerate(stream, start=first_line):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = raw[exc.start : exc.start + 1].hex()
            report.problem(lineno, None, f"not valid UTF-8 (byte 0x{bad} at column {exc.start + 1})")
            continue
        # shape_problem's own first test, inline: most lines have too few brackets to nest deep
        suspect = len(raw) > MAX_LINE_BYTES or raw.count(b"{") + raw.count(b"[") > MAX_DEPTH
        if suspect and (problem := shape_problem(raw, MAX_LINE_BYTES)):
            report.problem(lineno, None, f"not read: {problem}")
            continue
        try:
            value = decode(text)
        except msgspec.DecodeError as exc:
            report.problem(lineno, None, f"not valid JSON: {exc}")
            continue
        if not isinstance(value, dict):
            report.problem(lineno, None, f"expected a JSON object, got {type_name(value)}")
            continue
        yield lineno, value


# --------------------------------------------------------------------------- CSV


def _csv(stream: BinaryIO, report: Report, *, delimiter: str) -> Opened | None:
    _skip_bom(stream)
    start = stream.tell()
    bad_lines = False
    for lineno, raw in enumerate(stream, start=1):  # every bad line at once, before any parsing
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = raw[exc.start : exc.start + 1].hex()
            report.problem(lineno, None, f"not valid UTF-8 (byte 0x{bad} at column {exc.start + 1})")
            bad_lines = True
    if bad_lines:
        return None
    stream.seek(start)
    text = io.TextIOWrapper(io.BufferedReader(_Unclosed(stream)), encoding="utf-8", newline="")
    reader = csv.reader(text, delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        report.problem(1, None, f"unreadable CSV header: {exc}")
        return None
    if header is None or not any(h.strip() for h in header):
        return Opened("csv", False, iter(()))
    columns = [h.strip() for h in header]
    humaneval = is_humaneval(columns)
    return Opened(
        "humaneval" if humaneval else "csv", humaneval, _csv_records(reader, columns, report), columns, 1
    )


class _Unclosed(io.RawIOBase):
    """The caller's stream under a TextIOWrapper that must not close it."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _csv_records(reader: Any, columns: list[str], report: Report) -> Records:
    end = reader.line_num
    while True:
        start = end + 1  # a quoted cell may span lines: report where the record starts
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            report.problem(start, None, f"unreadable CSV: {exc}")
            return  # the reader cannot resynchronise after a broken quote
        end = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            report.problem(start, None, f"row has {len(row)} fields, the header has {len(columns)}")
            continue
        record: dict[str, Any] = {}
        for name, cell in zip(columns, row, strict=True):
            if cell == "":
                continue  # CSV cannot tell an empty cell from a missing value
            if name in CSV_JSON_COLUMNS:
                try:
                    if problem := shape_problem(cell, MAX_LINE_BYTES):
                        raise msgspec.DecodeError(problem)
                    record[name] = msgspec.json.decode(cell)
                except msgspec.DecodeError as exc:
                    report.problem(start, name, f'"{name}" must be JSON in a CSV cell: {exc}')
                    record[name] = INVALID
                    continue
            else:
                record[name] = cell
        yield start, record


# --------------------------------------------------------------------------- Parquet


def _parquet(stream: BinaryIO, report: Report) -> Opened | None:
    import pyarrow.parquet as pq  # heavy; only Parquet users pay for it

    report.unit = "row"
    try:
        parquet = pq.ParquetFile(stream)
        columns = list(parquet.schema_arrow.names)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for corrupt files
        report.problem(None, None, f"not a readable Parquet file: {exc}")
        return None
    humaneval = is_humaneval(columns)

    def rows() -> Records:
        index = 0
        try:
            for batch in parquet.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    index += 1
                    yield index, {k: v for k, v in row.items() if v is not None}
        except RecursionError:
            report.problem(index + 1, None, "a value nested too deeply to read")
        except Exception as exc:
            report.problem(None, None, f"not a readable Parquet file: {exc}")

    return Opened("humaneval" if humaneval else "parquet", humaneval, rows(), columns)
