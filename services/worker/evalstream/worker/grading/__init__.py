"""Graders: small factories returning `Grader` callables, one module each, plus the registry.

A grader takes the raw response (it cleans it itself; cleaning twice is harmless) and the
item, and returns a `Grade`. It raises `GradingError` for an item it cannot grade at all
(no gold answer, no tests); `item_problem` finds those up front, for the producer.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from evalstream.common.messages import Item
from evalstream.worker.grading import code_exec, exact, multiple_choice, numeric
from evalstream.worker.grading.base import Grade, Grader, GradingError
from evalstream.worker.grading.clean import CLEAN_VERSION

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
GRADER_VERSIONS: dict[str, str] = {
    "exact": exact.GRADER_VERSION,
    "numeric": numeric.GRADER_VERSION,
    "multiple_choice": multiple_choice.GRADER_VERSION,
    "code_exec": code_exec.GRADER_VERSION,
}
_PROBLEMS: dict[str, Callable[[Item], str | None]] = {
    "exact": exact.problem,
    "numeric": numeric.problem,
    "multiple_choice": multiple_choice.problem,
    "code_exec": code_exec.problem,
}
GRADER_VERSION = "1"  # of the registry itself: the "auto" selection rules below
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


def grader_version(name: str) -> str:
    """What a run manifest records: the versions of the grader(s) that `name` may use and of
    the response cleaning they share, e.g. "numeric/1 clean/1"."""
    names = sorted(GRADERS) if name == AUTO else [_known(name)]
    parts = [f"{AUTO}/{GRADER_VERSION}"] if name == AUTO else []
    parts += [f"{n}/{GRADER_VERSIONS[n]}" for n in names]
    return " ".join([*parts, f"clean/{CLEAN_VERSION}"])
