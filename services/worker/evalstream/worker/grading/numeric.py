"""Numeric answers (GSM8K, arithmetic): the final number of a response against the gold number.

Where the response marks its answer, that wins over the last number in the text, in this
order: the last \\boxed{...}, the last "#### ...", the last "answer is ..." / "answer: ...".
Numbers may carry a sign, a "$", thousands separators ("1,234"), decimals, an exponent or a
"%" (dropped: "12%" reads as 12), or be fractions ("1/2", "\\frac{1}{2}"). A gold answer may
be GSM8K's full solution ending in "#### 42". Equal means within a relative tolerance of
1e-6 (absolute 1e-9 near zero).
"""

from __future__ import annotations

import math
import re

from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response

GRADER_VERSION = "1"
REL_TOL = 1e-6
ABS_TOL = 1e-9

# A number not glued to a word or to another number ("H2O", "5-3" reads as 5 and 3).
_NUMBER = re.compile(
    r"""(?<![\w.])(?P<sign>[-+−])?\$?
    (?:(?P<num>\d+)\s*/\s*(?P<den>\d+)                      # 1/2
      |(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<dec>\.\d+)?  # 1,234.50  42
      |(?P<lead>\.\d+))                                     # .5
    (?P<exp>[eE][-+]?\d+)?""",
    re.X,
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b|:|=)", re.I)


def _prepare(text: str) -> str:
    """LaTeX spellings of plain numbers: \\frac{1}{2}, 1{,}234, \\$, \\!."""
    text = _LATEX_FRAC.sub(r"\1/\2", text)
    return text.replace("{,}", ",").replace("\\$", "$").replace("\\!", "")


def _value(m: re.Match[str]) -> float | None:
    sign = -1.0 if m["sign"] in ("-", "−") else 1.0
    exp = float(f"1{m['exp']}") if m["exp"] else 1.0
    if m["num"] is not None:
        den = int(m["den"])
        return None if den == 0 else sign * int(m["num"]) / den * exp
    digits = m["lead"] or m["int"].replace(",", "") + (m["dec"] or "")
    return sign * float(digits) * exp


def _numbers(text: str) -> list[float]:
    return [v for m in _NUMBER.finditer(text) if (v := _value(m)) is not None]


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...}, braces balanced."""
    out = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end() : i - 1 if depth == 0 else i])
    return out


def extract_number(text: str) -> float | None:
    """The answer number of a response: the first number after the strongest answer marker
    that has one, else the last number in the text."""
    text = _prepare(text)
    boxed = _boxed_contents(text)
    hashes = text.split("####")[1:]
    answer_is = [text[m.end() :].split("\n", 1)[0] for m in _ANSWER_IS.finditer(text)]
    for segments in (boxed, hashes, answer_is):
        if segments and (found := _numbers(segments[-1])):
            return found[0]
    found = _numbers(text)
    return found[-1] if found else None


def parse_number(text: str) -> float | None:
    """A gold answer as a number: the whole text (after GSM8K's "####", if any) must be one
    number, give or take a "%" or a final period; None otherwise."""
    text = _prepare(text.rsplit("####", 1)[-1]).strip().rstrip(".").rstrip("%").strip()
    m = _NUMBER.fullmatch(text)
    return _value(m) if m else None


def canonical(value: float) -> str:
    """42.0 -> "42", 3.50 -> "3.5": the shortest string that reads back as the same value."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def problem(item: Item) -> str | None:
    if item.answer is None or parse_number(item.answer) is None:
        return f"item {item.id}: gold answer {item.answer!r} is not a number"
    return None


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
