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
    loglikelihood  the engine's per-choice log-likelihoods: acc, acc_norm (loglikelihood.py)
    perplexity     the engine's rolling log-likelihood of a document (perplexity.py)
    lm_eval    lm-eval's filters and exact_match, from meta.lm_eval (lm_eval.py)
    auto       one of code/choice/numeric/exact per item, by its shape (never the three above)

A grader takes the raw response (it cleans it itself; cleaning twice is harmless) and the
item, and returns a `Grade`. It raises `GradingError` for an item it cannot grade at all
(no gold answer, no tests); `item_problem` finds those up front. What each grader needs of
an item, and the "auto" choice, are the shared library's (evalstream.common.gold): the
aggregator and evalctl check items without this package.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from evalstream.common import graders as registry

# names, versions, arguments and templates are the shared library's (one table, which the
# producer checks jobs against and records in run manifests); this package implements them
from evalstream.common.gold import canonical_grader, item_problem, resolve_grader
from evalstream.common.graders import AUTO, GRADER_NAMES, GRADER_VERSIONS, grader_version, split_grader
from evalstream.common.graders import AUTO_VERSION as GRADER_VERSION
from evalstream.common.messages import Item
from evalstream.worker.grading import (
    code_exec,
    contains,
    exact,
    json_field,
    judge,
    lm_eval,
    loglikelihood,
    multiple_choice,
    numeric,
    perplexity,
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
    "GradingError",
    "canonical_grader",
    "get_grader",
    "grader_version",
    "item_problem",
    "resolve_grader",
]


def _plain(make: Callable[[], Grader]) -> Callable[[str | None], Grader]:
    """A grader that takes no argument."""
    return lambda _argument: make()


# canonical name -> the SPEC's argument -> a grader
GRADERS: dict[str, Callable[[str | None], Grader]] = {
    "exact": _plain(exact.exact),
    "numeric": _plain(numeric.numeric),
    "choice": _plain(multiple_choice.multiple_choice),
    "regex": regex.regex,
    "contains": _plain(contains.contains),
    "json": json_field.json_field,
    "code": _plain(code_exec.code_exec),
    "judge": judge.judge,
    "loglikelihood": _plain(loglikelihood.loglikelihood),
    "perplexity": _plain(perplexity.perplexity),
    "lm_eval": _plain(lm_eval.lm_eval),
}
assert set(GRADERS) == set(registry.GRADERS), "every registered grader has one implementation"


_instances: dict[str, Grader] = {}
_instances_lock = threading.Lock()


def _instance(canonical: str) -> Grader:
    # One grader per SPEC: they keep no per-item state, and a judge's model loads only once,
    # even when the first items are graded from several threads at once.
    with _instances_lock:
        grader = _instances.get(canonical)
        if grader is None:
            name, argument = split_grader(canonical)
            grader = _instances[canonical] = GRADERS[name](argument)
    return grader


def _auto(response: str, item: Item) -> Grade:
    return _instance(resolve_grader(AUTO, item))(response, item)


def get_grader(spec: str, item: Item | None = None) -> Grader:
    """The grader for `spec`. For "auto": the one chosen for `item`, or without an item one
    that chooses per call. Raises ValueError for a bad SPEC."""
    if spec == AUTO:
        return _auto if item is None else _instance(resolve_grader(AUTO, item))
    return _instance(canonical_grader(spec))
