"""What is wrong with a dataset: problems (the set is refused) and warnings (it runs), each
with the line, or Parquet row, it was found on."""

from __future__ import annotations

import decimal
from typing import Literal

import msgspec

MAX_PROBLEMS_SHOWN = 20

Unit = Literal["line", "row"]


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


class Report:
    """The problems and warnings of one dataset, as its readers and checks find them."""

    def __init__(self) -> None:
        self.unit: Unit = "line"
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def problem(self, line: int | None, fld: str | None, message: str) -> None:
        self.problems.append(Problem(line, fld, message, self.unit))

    def warning(self, line: int | None, fld: str | None, message: str) -> None:
        self.warnings.append(Problem(line, fld, message, self.unit))


def by_line(problems: list[Problem]) -> list[Problem]:
    """File order; on one line, the id's problems first (they are found first in a record,
    a duplicate id only once the whole file was read)."""
    return sorted(
        problems, key=lambda p: (-1 if p.line is None else p.line, p.field not in ("id", "task_id"))
    )


def type_name(value: object) -> str:
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
