"""Graders: small factories returning `Grader` callables, one module each, plus the registry.

A grader takes the raw response (it cleans it itself; cleaning twice is harmless) and the
item, and returns a `Grade`. It raises `GradingError` for an item it cannot grade at all
(no gold answer, no tests); `item_problem` finds those up front, for the producer.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from evalstream.common.messages import Item

# versions are kept in the shared library: the producer records them in run manifests
from evalstream.common.versions import AUTO_VERSION as GRADER_VERSION
from evalstream.common.versions import GRADER_VERSIONS, grader_version
from evalstream.worker.grading import code_exec, exact, multiple_choice, numeric
from evalstream.worker.grading.base import Grade, Grader, GradingError

__all__ = [
    "GRADERS",
    "GRADER_NAMES",
    "GRADER_VERSION",
    "GRADER_VERSIONS",
    "Grade",
    "Grader",
    "GraderFactory",
    "GradingError",
    "get_grader",
    "grader_version",
    "item_problem",
    "resolve_grader",
]

GraderFactory = Callable[[], Grader]

GRADERS: dict[str, GraderFactory] = {
    "exact": exact.exact,
    "numeric": numeric.numeric,
    "multiple_choice": multiple_choice.multiple_choice,
    "code_exec": code_exec.code_exec,
}
_PROBLEMS: dict[str, Callable[[Item], str | None]] = {
    "exact": exact.problem,
    "numeric": numeric.problem,
    "multiple_choice": multiple_choice.problem,
    "code_exec": code_exec.problem,
}
AUTO = "auto"
GRADER_NAMES: frozenset[str] = frozenset({AUTO, *GRADERS})


def _known(name: str) -> str:
    if name not in GRADERS:
        raise ValueError(f"unknown grader {name!r}; known: {', '.join(sorted(GRADER_NAMES))}")
    return name


def resolve_grader(name: str, item: Item) -> str:
    """The concrete grader for `item`. "auto" picks by the item's shape: HumanEval (test +
    entry_point) -> code_exec; choices -> multiple_choice; a numeric gold answer -> numeric;
    anything else -> exact. Raises ValueError for an unknown name."""
    if name != AUTO:
        return _known(name)
    if item.test and item.entry_point:
        return "code_exec"
    if item.choices:
        return "multiple_choice"
    if item.answer is not None and numeric.parse_number(item.answer) is not None:
        return "numeric"
    return "exact"


@cache
def _instance(name: str) -> Grader:
    return GRADERS[name]()  # graders keep no state: one instance each is enough


def _auto(response: str, item: Item) -> Grade:
    return _instance(resolve_grader(AUTO, item))(response, item)


def get_grader(name: str, item: Item | None = None) -> Grader:
    """The grader called `name`. For "auto": the one chosen for `item`, or without an item
    one that chooses per call. Raises ValueError for an unknown name."""
    if name != AUTO:
        return _instance(_known(name))
    return _auto if item is None else _instance(resolve_grader(AUTO, item))


def item_problem(name: str, item: Item) -> str | None:
    """Why `item` cannot be graded by `name` (after "auto" resolution), or None: lets the
    producer reject a dataset before a run starts instead of failing items mid-run."""
    return _PROBLEMS[resolve_grader(name, item)](item)
