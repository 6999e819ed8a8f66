"""What every grader shares: its result, its call signature and its error."""

from __future__ import annotations

from typing import Protocol

import msgspec

from evalstream.common.messages import Item


class Grade(msgspec.Struct, frozen=True, kw_only=True):
    extracted: str | None  # what the grader read as the answer (None: nothing found)
    correct: bool
    score: float  # 0..1
    detail: str | None = None  # why it is wrong, or how it was matched when that is not obvious
    evidence: str | None = None  # what the grader ran and saw (a code test's output)
    # log-likelihood scoring (ItemResult's fields of the same names)
    ungraded: bool = False  # nothing to be right about (a perplexity): the result's `correct` is None
    correct_norm: bool | None = None
    loglikelihood: float | None = None
    doc_words: int | None = None
    doc_bytes: int | None = None


class Grader(Protocol):
    def __call__(self, response: str, item: Item) -> Grade: ...


class GradingError(ValueError):
    """The item cannot be graded this way (no gold answer, no tests...): a data error, not a
    wrong answer. The producer's validation is meant to catch these before a run starts."""


def require(problem: str | None) -> None:
    """Raises GradingError for a problem found by a grader module's `problem(item)`."""
    if problem is not None:
        raise GradingError(problem)
