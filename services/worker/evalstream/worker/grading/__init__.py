"""Graders: small factories returning `Grader` callables, one module each, plus the registry.

A job names its grader with a SPEC (evalstream.common.graders, which holds every grader's
name, version, argument and default template): a name, or `name:argument`
for the graders that take one:

    exact      normalised text equality            (exact.py)
    numeric    the final number, within 1e-6       (numeric.py)
    choice     the A-E letter picked               (multiple_choice.py; alias multiple_choice)
    regex      regex:<pattern>, or meta.regex      (regex.py)
    contains   the gold answer said in the response (contains.py)
    json       json:<field.path>, or meta.json_field (json_field.py)
    code       execution in the sandbox            (code_exec.py; alias code_exec)
    judge      judge:<model SPEC>, rubric meta.rubric (judge.py)
    auto       one of code/choice/numeric/exact per item, by its shape

A grader takes the raw response (it cleans it itself; cleaning twice is harmless) and the
item, and returns a `Grade`. It raises `GradingError` for an item it cannot grade at all
(no gold answer, no tests); `item_problem` finds those up front.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from evalstream.common import graders as registry

# names, versions, arguments and templates are the shared library's (one table, which the
# producer checks jobs against and records in run manifests); this package implements them
from evalstream.common.graders import (
    AUTO,
    GRADER_NAMES,
    GRADER_VERSIONS,
    grader_problem,
    grader_version,
    split_grader,
)
from evalstream.common.graders import AUTO_VERSION as GRADER_VERSION
from evalstream.common.messages import Item
from evalstream.worker.grading import (
    code_exec,
    contains,
    exact,
    json_field,
    judge,
    multiple_choice,
    numeric,
    regex,
)
from evalstream.worker.grading.base import Grade, Grader, GradingError

__all__ = [
    "AUTO",
    "GRADERS",
    "GRADER_NAMES",
    "GRADER_VERSION",
    "GRADER_VERSIONS",
    "Grade",
    "Grader",
    "GraderKind",
    "GradingError",
    "canonical_grader",
    "get_grader",
    "grader_version",
    "item_problem",
    "resolve_grader",
]


@dataclass(frozen=True)
class GraderKind:
    make: Callable[[str | None], Grader]  # the SPEC's argument -> a grader
    problem: Callable[[Item, str | None], str | None]  # why an item cannot be graded, or None


def _plain(make: Callable[[], Grader], problem: Callable[[Item], str | None]) -> GraderKind:
    """A grader that takes no argument."""
    return GraderKind(lambda _argument: make(), lambda item, _argument: problem(item))


GRADERS: dict[str, GraderKind] = {  # by canonical name
    "exact": _plain(exact.exact, exact.problem),
    "numeric": _plain(numeric.numeric, numeric.problem),
    "choice": _plain(multiple_choice.multiple_choice, multiple_choice.problem),
    "regex": GraderKind(regex.regex, regex.problem),
    "contains": _plain(contains.contains, contains.problem),
    "json": GraderKind(json_field.json_field, json_field.problem),
    "code": _plain(code_exec.code_exec, code_exec.problem),
    "judge": GraderKind(judge.judge, judge.problem),
}
assert set(GRADERS) == set(registry.GRADERS), "every registered grader has one implementation"


def canonical_grader(spec: str) -> str:
    """A grader SPEC with its name canonical ("code_exec" -> "code", "multiple_choice:" is
    an error). Raises ValueError for a bad SPEC, "auto" included (it needs an item)."""
    if spec == AUTO or (problem := grader_problem(spec)):
        raise ValueError(problem if spec != AUTO else "auto needs an item to choose a grader for")
    name, argument = split_grader(spec)
    return name if argument is None else f"{name}:{argument}"


def resolve_grader(spec: str, item: Item) -> str:
    """The canonical grader SPEC for `item`. "auto" picks by the item's shape: HumanEval
    (test + entry_point) -> code; choices -> choice; a numeric gold answer -> numeric;
    anything else -> exact. Raises ValueError for a bad SPEC."""
    if spec != AUTO:
        return canonical_grader(spec)
    if item.test and item.entry_point:
        return "code"
    if item.choices:
        return "choice"
    if item.answer is not None and numeric.parse_number(item.answer) is not None:
        return "numeric"
    return "exact"


_instances: dict[str, Grader] = {}
_instances_lock = threading.Lock()


def _instance(canonical: str) -> Grader:
    # One grader per SPEC: they keep no per-item state, and a judge's model loads only once,
    # even when the first items are graded from several threads at once.
    with _instances_lock:
        grader = _instances.get(canonical)
        if grader is None:
            name, argument = split_grader(canonical)
            grader = _instances[canonical] = GRADERS[name].make(argument)
    return grader


def _auto(response: str, item: Item) -> Grade:
    return _instance(resolve_grader(AUTO, item))(response, item)


def get_grader(spec: str, item: Item | None = None) -> Grader:
    """The grader for `spec`. For "auto": the one chosen for `item`, or without an item one
    that chooses per call. Raises ValueError for a bad SPEC."""
    if spec == AUTO:
        return _auto if item is None else _instance(resolve_grader(AUTO, item))
    return _instance(canonical_grader(spec))


def item_problem(spec: str, item: Item) -> str | None:
    """Why `item` cannot be graded by `spec` (after "auto" resolution), or None: lets a
    caller reject a dataset before grading starts instead of failing items one by one."""
    name, argument = split_grader(resolve_grader(spec, item))
    return GRADERS[name].problem(item, argument)
