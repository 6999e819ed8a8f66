"""What a record means: one record (a dict from formats.py) into an Item, every problem of it
reported with its line. Fields: `id`, one of `question` / `prompt` / `messages`, `answer`,
optional `choices`, `category`, `meta`, and `entry_point` + `test` for code tasks; HumanEval
records (`task_id, prompt, entry_point, test`) are recognised by their fields."""

from __future__ import annotations

import decimal
import math
from typing import Any

import msgspec

from evalstream.common.datasets.formats import HUMANEVAL_REQUIRED, INVALID, Opened
from evalstream.common.datasets.problems import Problem, Report, type_name
from evalstream.common.messages import ChatMessage, Item

GENERIC_FIELDS = frozenset(
    {"id", "question", "prompt", "messages", "answer", "choices", "category", "meta", "entry_point", "test"}
)
HUMANEVAL_FIELDS = frozenset(
    {"task_id", "prompt", "entry_point", "test", "canonical_solution", "category", "meta"}
)
_INPUT_FIELDS = ("question", "prompt", "messages")
_ROLES = frozenset({"system", "user", "assistant"})


class Fields:
    """Turns records into items, reporting on `report`."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def problem(self, line: int | None, fld: str | None, message: str) -> None:
        self.report.problem(line, fld, message)

    def item(self, line: int, rec: dict[str, Any], *, humaneval: bool) -> Item | None:
        return self.humaneval_item(line, rec) if humaneval else self.generic_item(line, rec)

    def item_id(self, line: int, rec: dict[str, Any], name: str) -> str | None:
        value = rec.get(name)
        if value is None:
            self.problem(line, name, f'missing field "{name}"')
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            self.problem(line, name, f'"{name}" must be a string or integer, got {type_name(value)}')
            return None
        if not value.strip():
            self.problem(line, name, f'empty "{name}"')
            return None
        return value

    def generic_item(self, line: int, rec: dict[str, Any]) -> Item | None:
        before = len(self.report.problems)
        item_id = quiet_id(rec, "id")

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

        # An absent optional field is None without a check: the checks below are most of a
        # large dataset's reading time.
        entry_point = test = choices = category = meta = None
        has_code_test = rec.get("test") is not None or rec.get("entry_point") is not None
        if has_code_test:
            entry_point = self.text(line, rec, "entry_point", required=True)
            test = self.text(line, rec, "test", required=True)
        answer = self.answer(line, rec, required=not has_code_test)
        if "choices" in rec:
            choices = self.choices(line, rec)
        if "category" in rec:
            category = self.text(line, rec, "category")
        if "meta" in rec:
            meta = self.meta(line, rec)
        if len(self.report.problems) > before or item_id is None:
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
        before = len(self.report.problems)
        item_id = quiet_id(rec, "task_id")
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
        if len(self.report.problems) > before or item_id is None:
            return None
        if prompt is not None and entry_point is not None and f"def {entry_point}(" not in prompt:
            self.report.warnings.append(
                Problem(line, "entry_point", f'"prompt" does not define {entry_point}()', self.report.unit)
            )
        if solution is not None:
            meta = {**(meta or {}), "canonical_solution": solution}
        return Item(
            id=item_id, question=prompt, category=category, entry_point=entry_point, test=test, meta=meta
        )

    # ------------------------------------------------------------------ fields

    def text(self, line: int, rec: dict[str, Any], name: str, *, required: bool = False) -> str | None:
        value = rec.get(name)
        if value is INVALID:
            return None
        if value is None:
            if required:
                self.problem(line, name, f'missing field "{name}"')
            return None
        if not isinstance(value, str):
            self.problem(line, name, f'"{name}" must be a string, got {type_name(value)}')
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
            text = canonical_number(value)
            if text is None:
                self.problem(line, "answer", f'"answer" must be a finite number, got {value}')
            return text
        self.problem(line, "answer", f'"answer" must be a string or number, got {type_name(value)}')
        return None

    def choices(self, line: int, rec: dict[str, Any]) -> list[str] | None:
        value = rec.get("choices")
        if value is None or value is INVALID:
            return None
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            got = type_name(value)
            if isinstance(value, list):
                got = "array containing " + ", ".join(
                    sorted({type_name(c) for c in value if not isinstance(c, str)})
                )
            self.problem(line, "choices", f'"choices" must be a list of strings, got {got}')
            return None
        if not value:
            self.problem(line, "choices", '"choices" is empty')
            return None
        return list(value)

    def meta(self, line: int, rec: dict[str, Any]) -> dict[str, Any] | None:
        value = rec.get("meta")
        if value is None or value is INVALID:
            return None
        if not isinstance(value, dict):
            self.problem(line, "meta", f'"meta" must be an object, got {type_name(value)}')
            return None
        try:
            msgspec.json.encode(value)
        except (TypeError, ValueError) as exc:
            self.problem(line, "meta", f'"meta" cannot be encoded as JSON: {exc}')
            return None
        return value

    def messages(self, line: int, value: Any) -> list[ChatMessage] | None:
        if value is INVALID:
            return None
        if not isinstance(value, list) or not value:
            got = "an empty array" if value == [] else type_name(value)
            self.problem(
                line, "messages", f'"messages" must be a non-empty list of {{role, content}}, got {got}'
            )
            return None
        out: list[ChatMessage] = []
        ok = True
        for i, m in enumerate(value, start=1):
            if not isinstance(m, dict):
                self.problem(line, "messages", f"message {i} must be an object, got {type_name(m)}")
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
                    line, "messages", f"message {i}: content must be a string, got {type_name(content)}"
                )
                ok = False
            if ok and isinstance(role, str) and isinstance(content, str):
                out.append(ChatMessage(role=role, content=content))
        if ok and not any(m.role == "user" for m in out):
            self.problem(line, "messages", '"messages" has no user message')
            ok = False
        return out if ok else None


def quiet_id(rec: dict[str, Any], name: str) -> str | None:
    """The id as `Fields.item_id` gives it, without reporting (the scan already has)."""
    value = rec.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value.strip() else None


def canonical_number(value: int | float | decimal.Decimal) -> str | None:
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


def check_columns(report: Report, opened: Opened) -> bool:
    """A table's header (CSV, Parquet): a missing column is one problem, not one per row;
    True for a file without one (JSON Lines)."""
    if opened.columns is None:
        return True
    columns, line = opened.columns, opened.header_line
    present = set(columns)
    missing: list[str] = []
    if opened.humaneval:
        missing = [c for c in HUMANEVAL_REQUIRED if c not in present]
    else:
        if "id" not in present:
            missing.append("id")
        if not present & set(_INPUT_FIELDS):
            missing.append("question (or prompt / messages)")
        if "answer" not in present and not {"test", "entry_point"} <= present:
            missing.append("answer")
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        report.problem(line, duplicated[0], f"duplicate columns: {', '.join(duplicated)}")
    if missing:
        have = ", ".join(c or "(blank)" for c in columns)
        report.problem(
            line, missing[0].split()[0], f"missing columns: {', '.join(missing)} (columns: {have})"
        )
    return not (missing or duplicated)
