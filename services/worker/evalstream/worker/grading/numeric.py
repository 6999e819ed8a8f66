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

from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response

GRADER_VERSION = GRADER_VERSIONS["numeric"]  # bump it there: run manifests record it
REL_TOL = 1e-6
ABS_TOL = 1e-9

# A number not glued to a Latin word or to another number ("H2O", "5-3" reads as 5 and 3);
# glued to CJK text it counts ("答えは123です"). Responses are untrusted: the possessive
# \d++ and \s*+ never give back digits for spaces to be tried again, so "1" * 30000 +
# " " * 30000 is one pass, not 30000 (giving back a digit could never let "/" match).
_NUMBER = re.compile(
    r"""(?<![A-Za-z0-9_.])(?P<sign>[-+−])?\$?
    (?:(?P<num>\d++)\s*+/\s*+(?P<den>\d++)                   # 1/2
      |(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<dec>\.\d+)?  # 1,234.50  42
      |(?P<lead>\.\d+))                                     # .5
    (?P<exp>[eE][-+]?\d+)?""",
    re.X,
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{\s*+(-?\d++)\s*+\}\{\s*+(\d++)\s*+\}")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*+\{")
_BRACE = re.compile(r"[{}]")
# Full-width digits and signs (U+FF10.., as East Asian keyboards type them), and Unicode
# minus signs, as their ASCII forms. Not NFKC: it would also turn "10²" into "102".
_TO_ASCII = str.maketrans(
    {**{chr(0xFF10 + d): str(d) for d in range(10)}, "．": ".", "，": ",", "％": "%", "＋": "+",
     "－": "-", "／": "/", "＄": "$", "−": "-", "‒": "-", "–": "-", "﹣": "-"}
)  # fmt: skip


def _prepare(text: str) -> str:
    """ASCII digits and signs; LaTeX spellings of plain numbers: \\frac{1}{2}, 1{,}234, \\$, \\!."""
    text = _LATEX_FRAC.sub(r"\1/\2", text.translate(_TO_ASCII))
    return text.replace("{,}", ",").replace("\\$", "$").replace("\\!", "")


def _value(m: re.Match[str]) -> float | None:
    sign = -1.0 if m["sign"] == "-" else 1.0
    exp = float(f"1{m['exp']}") if m["exp"] else 1.0
    if m["num"] is not None:
        den = int(m["den"])
        return None if den == 0 else sign * int(m["num"]) / den * exp
    digits = m["lead"] or m["int"].replace(",", "") + (m["dec"] or "")
    return sign * float(digits) * exp


def _numbers(text: str) -> list[float]:
    return [v for m in _NUMBER.finditer(text) if (v := _value(m)) is not None]


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
    text = _prepare(text)
    if (boxed := _last_boxed(text)) is not None:
        found = _numbers(boxed)
        return found[-1] if found else None
    if "####" in text:
        found = _numbers(text.rsplit("####", 1)[1])
        return found[0] if found else None
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
