"""Numeric answers (GSM8K, arithmetic): the final number of a response against the gold number.

The final answer, exactly as the policy says: the content of the last \\boxed{...} if there
is one (its last number), else what follows the last "####" (its first number), else the
last number in the text. No other marker counts ("the answer is 8, after 3 steps" reads as
3). Numbers may carry a sign (ASCII or Unicode minus), a "$", thousands separators
("1,234"), decimals, scientific notation ("1e6", "2.5E-3"), a trailing "%" (dropped: "12%"
reads as 12, so a gold "25%" matches 25), be fractions ("3/4", "\\frac{3}{4}"), or be written
in full-width characters ("１２３"); number words are not parsed. A gold answer may be
GSM8K's full solution ending in "#### 42". Equal means within a relative tolerance of 1e-6
(absolute 1e-9 near zero).
"""

from __future__ import annotations

import math
import re

from evalstream.common.gold import NUMBER, ascii_numbers, number_value, parse_number
from evalstream.common.gold import numeric_problem as problem
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response

GRADER_VERSION = GRADER_VERSIONS["numeric"]  # bump it there: run manifests record it
REL_TOL = 1e-6
ABS_TOL = 1e-9

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*+\{")
_BRACE = re.compile(r"[{}]")


def _numbers(text: str) -> list[float]:
    return [v for m in NUMBER.finditer(text) if (v := number_value(m)) is not None]


def _last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...}, braces balanced (to the end when unclosed); None
    when there is none. Only the last is scanned: "\\boxed{" * 20000 is one pass."""
    last = None
    for last in _BOXED.finditer(text):  # noqa: B007 (the last one is what we want)
        pass
    if last is None:
        return None
    depth = 1
    for brace in _BRACE.finditer(text, last.end()):
        depth += 1 if brace[0] == "{" else -1
        if depth == 0:
            return text[last.end() : brace.start()]
    return text[last.end() :]


def extract_number(text: str) -> float | None:
    """The answer number of a response, by the policy above. A marker decides even when it
    holds no number: "\\boxed{n}" is no numeric answer, whatever numbers precede it."""
    text = ascii_numbers(text)
    if (boxed := _last_boxed(text)) is not None:
        found = _numbers(boxed)
        return found[-1] if found else None
    if "####" in text:
        found = _numbers(text.rsplit("####", 1)[1])
        return found[0] if found else None
    found = _numbers(text)
    return found[-1] if found else None


def canonical(value: float) -> str:
    """42.0 -> "42", 3.50 -> "3.5": the shortest string that reads back as the same value."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def numeric(rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item))
        gold = parse_number(item.answer or "")
        assert gold is not None  # checked by problem()
        value = extract_number(clean_response(response))
        if value is None:
            return Grade(extracted=None, correct=False, score=0.0, detail="no number in the response")
        correct = math.isclose(value, gold, rel_tol=rel_tol, abs_tol=abs_tol)
        detail = None if correct else f"expected {canonical(gold)}"
        return Grade(extracted=canonical(value), correct=correct, score=float(correct), detail=detail)

    return grade
