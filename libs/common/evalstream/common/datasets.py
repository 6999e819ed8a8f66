"""Dataset readers and validation, shared by the producer's intake and evalctl (which checks
a file before uploading it, and reads stored copies for `datasets` and `reproduce`).

A run must never start on a question set that turns out to be broken half-way through, so
the producer reads and validates the *whole* file before it publishes a single shard, and
reports every problem at once (with line numbers) so the user can fix the file in one go.

Formats are chosen by extension: JSON Lines (`.jsonl`, `.json`, `.ndjson`), Parquet, CSV
(and TSV). HumanEval files (`task_id, prompt, entry_point, test`) are recognised by their
fields in any of these formats.
"""

from __future__ import annotations

import csv
import decimal
import hashlib
import io
import itertools
import math
import os
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec

from evalstream.common.messages import ChatMessage, Item, encode

__all__ = [
    "DEFAULT_MAX_ITEM_BYTES",
    "DatasetError",
    "LoadedDataset",
    "Problem",
    "content_sha256",
    "load_dataset",
    "load_dataset_file",
    "write_stored_copy",
]

# Kafka's default max.message.bytes is 1 MiB; one item must fit in a shard message with room
# for the envelope, or it could never be delivered.
DEFAULT_MAX_ITEM_BYTES = 900_000
MAX_PROBLEMS_SHOWN = 20

Format = Literal["jsonl", "parquet", "csv", "humaneval"]
Unit = Literal["line", "row"]

_JSONL_EXTS = {".jsonl", ".json", ".ndjson"}
_CSV_EXTS = {".csv": ",", ".tsv": "\t"}
_PARQUET_EXTS = {".parquet", ".pq"}

_GENERIC_FIELDS = frozenset(
    {"id", "question", "prompt", "messages", "answer", "choices", "category", "meta", "entry_point", "test"}
)
_HUMANEVAL_REQUIRED = ("task_id", "prompt", "entry_point", "test")
_HUMANEVAL_FIELDS = frozenset({*_HUMANEVAL_REQUIRED, "canonical_solution", "category", "meta"})
_INPUT_FIELDS = ("question", "prompt", "messages")
_ROLES = frozenset({"system", "user", "assistant"})
# CSV cells are text; these columns hold JSON.
_CSV_JSON_COLUMNS = frozenset({"messages", "choices", "meta"})
_END_PUNCTUATION = (
    string.punctuation + " \u00bf\u00a1\u2026\u201c\u201d\u2018\u2019\u00ab\u00bb\u3002\uff1f\uff01"
)
_BOM = b"\xef\xbb\xbf"


class Problem(msgspec.Struct, frozen=True):
    """One thing wrong with (or, as a warning, suspicious about) a dataset.

    `line` is 1-based: the file line for JSONL and CSV (the CSV header is line 1), the row
    index for Parquet (then `unit` is "row"); None for problems with the file as a whole.
    """

    line: int | None
    field: str | None
    message: str
    unit: Unit = "line"

    def __str__(self) -> str:
        return self.message if self.line is None else f"{self.unit} {self.line}: {self.message}"


class DatasetError(Exception):
    """The dataset cannot be used; `problems` lists everything found, not just the first."""

    def __init__(self, problems: list[Problem], filename: str | None = None) -> None:
        self.problems = problems
        self.filename = filename
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f" in {self.filename}" if self.filename else ""
        n = len(self.problems)
        lines = [f"{n} problem{'s' if n != 1 else ''}{where}:"]
        lines += [f"  {p}" for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        if n > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {n - MAX_PROBLEMS_SHOWN} more")
        return "\n".join(lines)


@dataclass(frozen=True)
class LoadedDataset:
    """A fully validated question set.

    `sha256` identifies the exact bytes (what was uploaded); `content_sha256` identifies the
    questions and gold labels regardless of order and file format, so that a converted or
    shuffled copy of the same set is recognisably the same benchmark.
    """

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
    return load_dataset(p.read_bytes(), p.name, max_item_bytes=max_item_bytes)


def load_dataset(
    data: bytes, filename: str, *, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES
) -> LoadedDataset:
    """Parses and validates a whole dataset; raises DatasetError listing every problem."""
    ext = os.path.splitext(filename)[1].lower()
    reader = _Reader(max_item_bytes)
    fmt: Format
    if ext in _JSONL_EXTS:
        fmt = reader.read_jsonl(data, allow_array_hint=ext == ".json")
    elif ext in _CSV_EXTS:
        fmt = reader.read_csv(data, delimiter=_CSV_EXTS[ext])
    elif ext in _PARQUET_EXTS:
        fmt = reader.read_parquet(data)
    else:
        known = ", ".join(sorted(_JSONL_EXTS | set(_CSV_EXTS) | _PARQUET_EXTS))
        shown = ext or "(none)"
        reader.problem(None, None, f"unsupported file extension {shown} (expected one of {known})")
        raise DatasetError(reader.problems, filename)

    if not reader.problems and not reader.items:
        reader.problem(None, None, "dataset is empty")
    if reader.problems:
        raise DatasetError(_sorted(reader.problems), filename)
    reader.check_conflicting_answers()
    return LoadedDataset(
        items=[item for _, item in reader.items],
        format=fmt,
        sha256=hashlib.sha256(data).hexdigest(),
        content_sha256=content_sha256(item for _, item in reader.items),
        warnings=_sorted(reader.unknown_field_warnings() + reader.warnings),
        filename=filename,
    )


def content_sha256(items: Iterable[Item]) -> str:
    """Order- and format-independent hash: sha256 over the sorted canonical JSON of each item
    (keys sorted, defaults omitted), one per line."""
    h = hashlib.sha256()
    for encoded in sorted(_canonical(item) for item in items):
        h.update(encoded)
        h.update(b"\n")  # canonical JSON never contains a raw newline
    return h.hexdigest()


def _lines(data: bytes) -> Iterator[bytes]:
    """data.split(b"\\n") one line at a time, without a list of every line."""
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        yield data[start:end]
        start = end + 1
    yield data[start:]


def _canonical(item: Item) -> bytes:
    return msgspec.json.encode(item, order="sorted")


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: -1 if p.line is None else p.line)


def _type_name(value: object) -> str:
    """The JSON name of a value's type, for messages a user of any language understands."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float | decimal.Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _canonical_number(value: int | float | decimal.Decimal) -> str | None:
    """42 -> "42", 2.5 -> "2.5", 42.0 -> "42" (Parquet float columns), NaN -> None."""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        return format(value.normalize(), "f")
    if not math.isfinite(value):
        return None
    if value.is_integer():
        return str(int(value))
    return repr(value)


def _normalise(text: str) -> str:
    """For spotting repeated questions: case, spacing and end punctuation do not count."""
    return " ".join(text.lower().split()).strip(_END_PUNCTUATION)


class _Reader:
    """Collects items and problems across one dataset."""

    def __init__(self, max_item_bytes: int) -> None:
        self.max_item_bytes = max_item_bytes
        self.unit: Unit = "line"
        self.items: list[tuple[int, Item]] = []
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        self._ids: dict[str, int] = {}
        self._unknown: dict[str, tuple[int, int]] = {}  # field -> (first line, count)

    def problem(self, line: int | None, fld: str | None, message: str) -> None:
        self.problems.append(Problem(line, fld, message, self.unit))

    # ------------------------------------------------------------------ formats

    def read_jsonl(self, data: bytes, *, allow_array_hint: bool) -> Format:
        if data.startswith(_BOM):
            data = data[len(_BOM) :]
        if allow_array_hint and data.lstrip()[:1] == b"[":
            self.problem(
                None, None, "a JSON array is not supported: give one JSON object per line (JSON Lines)"
            )
            return "jsonl"
        # A stream of records, each validated and dropped in turn: a set's parsed JSON is
        # never all in memory at once beside its items.
        records = self._jsonl_records(data)
        first = next(records, None)
        if first is None:
            return "jsonl"  # empty: reported by the caller
        humaneval = _is_humaneval(first[1].keys())
        self.validate(itertools.chain([first], records), humaneval=humaneval)
        return "humaneval" if humaneval else "jsonl"

    def _jsonl_records(self, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
        for lineno, raw in enumerate(_lines(data), start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1].hex()
                self.problem(lineno, None, f"not valid UTF-8 (byte 0x{bad} at column {exc.start + 1})")
                continue
            try:
                value = msgspec.json.decode(text)
            except msgspec.DecodeError as exc:
                self.problem(lineno, None, f"not valid JSON: {exc}")
                continue
            if not isinstance(value, dict):
                self.problem(lineno, None, f"expected a JSON object, got {_type_name(value)}")
                continue
            yield lineno, value

    def read_csv(self, data: bytes, *, delimiter: str) -> Format:
        if data.startswith(_BOM):
            data = data[len(_BOM) :]
        bad_lines = False
        for lineno, raw in enumerate(_lines(data), start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1].hex()
                self.problem(lineno, None, f"not valid UTF-8 (byte 0x{bad} at column {exc.start + 1})")
                bad_lines = True
        if bad_lines:
            return "csv"
        reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""), delimiter=delimiter, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            self.problem(1, None, f"unreadable CSV header: {exc}")
            return "csv"
        if header is None or not any(h.strip() for h in header):
            return "csv"  # empty: reported by the caller
        columns = [h.strip() for h in header]
        humaneval = _is_humaneval(columns)
        if not self.check_columns(1, columns, humaneval=humaneval):
            return "csv"
        self.validate(self._csv_records(reader, columns), humaneval=humaneval)  # streamed, as JSONL
        return "humaneval" if humaneval else "csv"

    def _csv_records(self, reader: Any, columns: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
        end = reader.line_num
        while True:
            start = end + 1  # a quoted cell may span lines: report where the record starts
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                self.problem(start, None, f"unreadable CSV: {exc}")
                return  # the reader cannot resynchronise after a broken quote
            end = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                self.problem(start, None, f"row has {len(row)} fields, the header has {len(columns)}")
                continue
            record: dict[str, Any] = {}
            for name, cell in zip(columns, row, strict=True):
                if cell == "":
                    continue  # CSV cannot tell an empty cell from a missing value
                if name in _CSV_JSON_COLUMNS:
                    try:
                        record[name] = msgspec.json.decode(cell)
                    except msgspec.DecodeError as exc:
                        self.problem(start, name, f'"{name}" must be JSON in a CSV cell: {exc}')
                        record[name] = _INVALID
                        continue
                else:
                    record[name] = cell
            yield start, record

    def read_parquet(self, data: bytes) -> Format:
        import pyarrow.parquet as pq  # heavy; only Parquet users pay for it

        self.unit = "row"
        try:
            table = pq.read_table(io.BytesIO(data))
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for corrupt files
            self.problem(None, None, f"not a readable Parquet file: {exc}")
            return "parquet"
        columns = list(table.column_names)
        humaneval = _is_humaneval(columns)
        if not self.check_columns(None, columns, humaneval=humaneval):
            return "parquet"

        def rows() -> Iterator[tuple[int, dict[str, Any]]]:
            index = 0
            for batch in table.to_batches():
                for row in batch.to_pylist():
                    index += 1
                    yield index, {k: v for k, v in row.items() if v is not None}

        self.validate(rows(), humaneval=humaneval)
        return "humaneval" if humaneval else "parquet"

    def check_columns(self, line: int | None, columns: list[str], *, humaneval: bool) -> bool:
        """Tabular files: a missing column is one problem, not one per row."""
        present = set(columns)
        missing: list[str] = []
        if humaneval:
            missing = [c for c in _HUMANEVAL_REQUIRED if c not in present]
        else:
            if "id" not in present:
                missing.append("id")
            if not present & set(_INPUT_FIELDS):
                missing.append("question (or prompt / messages)")
            if "answer" not in present and not {"test", "entry_point"} <= present:
                missing.append("answer")
        duplicated = sorted({c for c in columns if columns.count(c) > 1})
        if duplicated:
            self.problem(line, duplicated[0], f"duplicate columns: {', '.join(duplicated)}")
        if missing:
            have = ", ".join(c or "(blank)" for c in columns)
            self.problem(
                line, missing[0].split()[0], f"missing columns: {', '.join(missing)} (columns: {have})"
            )
        return not (missing or duplicated)

    # ------------------------------------------------------------------ records

    def validate(self, records: Iterable[tuple[int, dict[str, Any]]], *, humaneval: bool) -> None:
        for line, record in records:
            known = _HUMANEVAL_FIELDS if humaneval else _GENERIC_FIELDS
            for name in record:
                if name not in known:
                    first, count = self._unknown.get(name, (line, 0))
                    self._unknown[name] = (first, count + 1)
            item_id = self.item_id(line, record, "task_id" if humaneval else "id")
            if item_id is not None:
                # checked even when the rest of the item is bad, so both problems show at once
                first_line = self._ids.get(item_id)
                if first_line is not None:
                    self.problem(line, "id", f'duplicate id "{item_id}" (first on {self.unit} {first_line})')
                    item_id = None
                else:
                    self._ids[item_id] = line
            item = self.humaneval_item(line, record) if humaneval else self.generic_item(line, record)
            if item is None or item_id is None:
                continue
            size = len(_canonical(item))
            if size > self.max_item_bytes:
                self.problem(
                    line,
                    None,
                    f"item {item.id!r} is {size} bytes as JSON, over the {self.max_item_bytes}-byte limit "
                    "for one Kafka message",
                )
                continue
            self.items.append((line, item))

    def generic_item(self, line: int, rec: dict[str, Any]) -> Item | None:
        before = len(self.problems)
        item_id = _quiet_id(rec, "id")

        given = [name for name in _INPUT_FIELDS if rec.get(name) is not None]
        question: str | None = None
        messages: list[ChatMessage] | None = None
        if not given:
            self.problem(line, "question", 'missing field "question" (or "prompt" / "messages")')
        elif len(given) > 1:
            names = " and ".join(f'"{n}"' for n in given)
            self.problem(line, given[1], f"give the input one way only, not {names}")
        elif given[0] == "messages":
            messages = self.messages(line, rec["messages"])
        else:
            question = self.text(line, rec, given[0], required=True)

        has_code_test = rec.get("test") is not None or rec.get("entry_point") is not None
        entry_point = self.text(line, rec, "entry_point", required=has_code_test)
        test = self.text(line, rec, "test", required=has_code_test)
        answer = self.answer(line, rec, required=not has_code_test)
        choices = self.choices(line, rec)
        category = self.text(line, rec, "category")
        meta = self.meta(line, rec)
        if len(self.problems) > before or item_id is None:
            return None
        return Item(
            id=item_id,
            question=question,
            messages=messages,
            answer=answer,
            choices=choices,
            category=category,
            entry_point=entry_point,
            test=test,
            meta=meta,
        )

    def humaneval_item(self, line: int, rec: dict[str, Any]) -> Item | None:
        before = len(self.problems)
        item_id = _quiet_id(rec, "task_id")
        prompt = self.text(line, rec, "prompt", required=True)
        entry_point = self.text(line, rec, "entry_point", required=True)
        test = self.text(line, rec, "test", required=True)
        category = self.text(line, rec, "category") or "code"
        meta = self.meta(line, rec)
        solution = self.text(line, rec, "canonical_solution")
        if entry_point is not None and not entry_point.isidentifier():
            self.problem(
                line, "entry_point", f'"entry_point" must be a Python function name, got {entry_point!r}'
            )
        if test is not None and "def check(" not in test:
            self.problem(line, "test", '"test" must define check(candidate), as in HumanEval')
        if len(self.problems) > before or item_id is None:
            return None
        if prompt is not None and entry_point is not None and f"def {entry_point}(" not in prompt:
            self.warnings.append(
                Problem(line, "entry_point", f'"prompt" does not define {entry_point}()', self.unit)
            )
        if solution is not None:
            meta = {**(meta or {}), "canonical_solution": solution}
        return Item(
            id=item_id, question=prompt, category=category, entry_point=entry_point, test=test, meta=meta
        )

    # ------------------------------------------------------------------ fields

    def item_id(self, line: int, rec: dict[str, Any], name: str) -> str | None:
        value = rec.get(name)
        if value is None:
            self.problem(line, name, f'missing field "{name}"')
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            self.problem(line, name, f'"{name}" must be a string or integer, got {_type_name(value)}')
            return None
        if not value.strip():
            self.problem(line, name, f'empty "{name}"')
            return None
        return value

    def text(self, line: int, rec: dict[str, Any], name: str, *, required: bool = False) -> str | None:
        value = rec.get(name)
        if value is _INVALID:
            return None
        if value is None:
            if required:
                self.problem(line, name, f'missing field "{name}"')
            return None
        if not isinstance(value, str):
            self.problem(line, name, f'"{name}" must be a string, got {_type_name(value)}')
            return None
        if required and not value.strip():
            self.problem(line, name, f'empty "{name}"')
            return None
        return value

    def answer(self, line: int, rec: dict[str, Any], *, required: bool) -> str | None:
        value = rec.get("answer")
        if value is None:
            if required:
                self.problem(line, "answer", 'missing field "answer"')
            return None
        if isinstance(value, str):
            if not value.strip():
                self.problem(line, "answer", 'empty "answer"')
                return None
            return value
        if isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool):
            text = _canonical_number(value)
            if text is None:
                self.problem(line, "answer", f'"answer" must be a finite number, got {value}')
            return text
        self.problem(line, "answer", f'"answer" must be a string or number, got {_type_name(value)}')
        return None

    def choices(self, line: int, rec: dict[str, Any]) -> list[str] | None:
        value = rec.get("choices")
        if value is None or value is _INVALID:
            return None
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            got = _type_name(value)
            if isinstance(value, list):
                got = "array containing " + ", ".join(
                    sorted({_type_name(c) for c in value if not isinstance(c, str)})
                )
            self.problem(line, "choices", f'"choices" must be a list of strings, got {got}')
            return None
        if not value:
            self.problem(line, "choices", '"choices" is empty')
            return None
        return list(value)

    def meta(self, line: int, rec: dict[str, Any]) -> dict[str, Any] | None:
        value = rec.get("meta")
        if value is None or value is _INVALID:
            return None
        if not isinstance(value, dict):
            self.problem(line, "meta", f'"meta" must be an object, got {_type_name(value)}')
            return None
        try:
            msgspec.json.encode(value)
        except (TypeError, ValueError) as exc:
            self.problem(line, "meta", f'"meta" cannot be encoded as JSON: {exc}')
            return None
        return value

    def messages(self, line: int, value: Any) -> list[ChatMessage] | None:
        if value is _INVALID:
            return None
        if not isinstance(value, list) or not value:
            got = "an empty array" if value == [] else _type_name(value)
            self.problem(
                line, "messages", f'"messages" must be a non-empty list of {{role, content}}, got {got}'
            )
            return None
        out: list[ChatMessage] = []
        ok = True
        for i, m in enumerate(value, start=1):
            if not isinstance(m, dict):
                self.problem(line, "messages", f"message {i} must be an object, got {_type_name(m)}")
                ok = False
                continue
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or role not in _ROLES:
                self.problem(
                    line,
                    "messages",
                    f"message {i}: role must be one of system, user, assistant, got {role!r}",
                )
                ok = False
            if not isinstance(content, str):
                self.problem(
                    line, "messages", f"message {i}: content must be a string, got {_type_name(content)}"
                )
                ok = False
            if ok and isinstance(role, str) and isinstance(content, str):
                out.append(ChatMessage(role=role, content=content))
        if ok and not any(m.role == "user" for m in out):
            self.problem(line, "messages", '"messages" has no user message')
            ok = False
        return out if ok else None

    # ------------------------------------------------------------------ warnings

    def unknown_field_warnings(self) -> list[Problem]:
        return [
            Problem(
                first,
                name,
                f'unknown field "{name}" ignored ({count} {self.unit}{"s" if count > 1 else ""})',
                self.unit,
            )
            for name, (first, count) in self._unknown.items()
        ]

    def check_conflicting_answers(self) -> None:
        """The same question with two different gold answers is almost always a labelling
        mistake that would cap accuracy below 100 %; worth a warning, not a refusal."""
        seen: dict[bytes, tuple[int, Item]] = {}  # digest of the question -> its first item
        for line, item in self.items:
            if item.answer is None:
                continue
            if item.messages is not None:
                text = "\n".join(f"{m.role}: {m.content}" for m in item.messages)
            else:
                text = item.question or ""
            question = (_normalise(text), item.choices)
            key = hashlib.blake2b(msgspec.json.encode(question), digest_size=16).digest()
            first = seen.get(key)
            if first is None:
                seen[key] = (line, item)
                continue
            first_line, first_item = first
            if _normalise(first_item.answer or "") != _normalise(item.answer):
                self.warnings.append(
                    Problem(
                        line,
                        "answer",
                        f'"{item.id}" repeats the question of "{first_item.id}" ({self.unit} {first_line}) '
                        f"with a different answer: {item.answer!r} vs {first_item.answer!r}",
                        self.unit,
                    )
                )


class _Invalid:
    """Marks a CSV cell already reported as bad JSON, so it is not reported twice."""


_INVALID: Any = _Invalid()


def _quiet_id(rec: dict[str, Any], name: str) -> str | None:
    """The id as `_Reader.item_id` gives it, without reporting (validate already has)."""
    value = rec.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value.strip() else None


def _is_humaneval(fields: Iterable[str]) -> bool:
    names = set(fields)
    return set(_HUMANEVAL_REQUIRED) <= names and "id" not in names


def write_stored_copy(items: Iterable[Item], out: BinaryIO) -> None:
    """The dataset as stored in S3 (and read back by reproductions): JSONL of the items,
    which loads back to the same content hash."""
    for item in items:
        out.write(encode(item))
        out.write(b"\n")
