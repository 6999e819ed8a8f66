"""Reading gold answers, and which items each grader can grade.

The graders are the worker's (evalstream.worker.grading), but what a grader needs of an item
- a gold answer that reads as a number, a letter among the choices, a pattern, tests - is a
contract the others check too: the aggregator before it regrades a run, `evalctl regrade`
before it asks, `evalctl audit` for gold labels no grader can read. So the reading of gold
answers (text normalisation, numbers, choice letters) and each grader's item check live
here once, and the worker's graders use them.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

from evalstream.common.graders import AUTO, GRADERS, grader_problem, json_path, split_grader
from evalstream.common.lmeval_filters import meta_problem
from evalstream.common.messages import Item
from evalstream.common.scoring import loglikelihood_problem, perplexity_problem

# --------------------------------------------------------------------------- free text

_ANSWER_PREFIX = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is\b|:)\s*:?\s*")
_WRAPPERS = " \"'`*"  # quotes and markdown emphasis around an answer
_TRAILING = ".!?,;:"


def normalize(text: str) -> str:
    """Case-folded, whitespace collapsed, a leading "the answer is" / "answer:" dropped,
    surrounding quotes, markdown emphasis and trailing punctuation stripped."""
    text = " ".join(text.split()).casefold().lstrip(_WRAPPERS)
    text = _ANSWER_PREFIX.sub("", text)
    return text.strip(_WRAPPERS).rstrip(_WRAPPERS + _TRAILING)


# --------------------------------------------------------------------------- numbers

# A number not glued to a Latin word or to another number ("H2O", "5-3" reads as 5 and 3);
# glued to CJK text it counts ("答えは123です"). Text is untrusted: the possessive \d++ and
# \s*+ never give back digits for spaces to be tried again, so "1" * 30000 + " " * 30000 is
# one pass, not 30000 (giving back a digit could never let "/" match).
NUMBER = re.compile(
    r"""(?<![A-Za-z0-9_.])(?P<sign>[-+−])?\$?
    (?:(?P<num>\d++)\s*+/\s*+(?P<den>\d++)                   # 1/2
      |(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<dec>\.\d+)?  # 1,234.50  42
      |(?P<lead>\.\d+))                                     # .5
    (?P<exp>[eE][-+]?\d+)?""",
    re.X,
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\{\s*+(-?\d++)\s*+\}\{\s*+(\d++)\s*+\}")
# Full-width digits and signs (U+FF10.., as East Asian keyboards type them), and Unicode
# minus signs, as their ASCII forms. Not NFKC: it would also turn "10²" into "102".
_TO_ASCII = str.maketrans(
    {**{chr(0xFF10 + d): str(d) for d in range(10)}, "．": ".", "，": ",", "％": "%", "＋": "+",
     "－": "-", "／": "/", "＄": "$", "−": "-", "‒": "-", "–": "-", "﹣": "-"}
)  # fmt: skip


def ascii_numbers(text: str) -> str:
    """ASCII digits and signs; LaTeX spellings of plain numbers: \\frac{1}{2}, 1{,}234, \\$, \\!."""
    if text.isascii() and "\\" not in text and "{," not in text:
        return text  # nothing below would change it (isascii is O(1)): most answers and golds
    text = _LATEX_FRAC.sub(r"\1/\2", text.translate(_TO_ASCII))
    return text.replace("{,}", ",").replace("\\$", "$").replace("\\!", "")


def number_value(m: re.Match[str]) -> float | None:
    """The value of a NUMBER match (None for a fraction over zero)."""
    sign = -1.0 if m["sign"] == "-" else 1.0
    exp = float(f"1{m['exp']}") if m["exp"] else 1.0
    if m["num"] is not None:
        den = int(m["den"])
        return None if den == 0 else sign * int(m["num"]) / den * exp
    digits = m["lead"] or m["int"].replace(",", "") + (m["dec"] or "")
    return sign * float(digits) * exp


def parse_number(text: str) -> float | None:
    """A gold answer as a number: the whole text (after GSM8K's "####", if any) must be one
    number, give or take a "%" or a final period; None otherwise."""
    if text.isascii() and text.isdigit():
        return float(text)  # what NUMBER makes of plain digits, without the regular expressions
    text = ascii_numbers(text.rsplit("####", 1)[-1]).strip().rstrip(".").rstrip("%").strip()
    m = NUMBER.fullmatch(text)
    return number_value(m) if m else None


# --------------------------------------------------------------------------- choices

LETTERS = string.ascii_uppercase
UNLISTED_LETTERS = "ABCDE"  # an item without `choices` (they are in its question)
LONE_LETTER = re.compile(r"[(\[]?([A-Za-z])[)\]]?[.:]?")


def letters_of(item: Item) -> str:
    return LETTERS[: len(item.choices)] if item.choices else UNLISTED_LETTERS


def gold_letter(item: Item) -> str | None:
    """The gold answer as a letter: a lone letter ("B", "(b)"), the text of a choice, or a
    0-based index ("1", as MMLU exports have it) when no choice has that text."""
    choices = item.choices or []
    gold = (item.answer or "").strip()
    if m := LONE_LETTER.fullmatch(gold):
        return m[1].upper() if m[1].upper() in letters_of(item) else None
    by_text = [LETTERS[i] for i, choice in enumerate(choices) if normalize(choice) == normalize(gold)]
    if by_text:
        return by_text[0]
    if gold.isdigit() and int(gold) < len(choices):
        return LETTERS[int(gold)]
    return None


# --------------------------------------------------------------------------- arguments


def pattern_for(item: Item, default: str | None) -> tuple[str | None, bool]:
    """The regex grader's pattern: meta.regex, else the SPEC's, else the gold answer
    (pattern, whether it is the gold answer itself)."""
    meta = item.meta or {}
    given = meta.get("regex") if isinstance(meta.get("regex"), str) else None
    pattern = given or default
    return (pattern, False) if pattern else (item.answer, True)


def field_for(item: Item, default: str | None) -> str | None:
    """The json grader's field path: meta.json_field, else the SPEC's (None: the whole document)."""
    meta = item.meta or {}
    given = meta.get("json_field")
    return given if isinstance(given, str) and given else default


# --------------------------------------------------------------------------- item checks


def needs_gold(item: Item, _argument: str | None = None) -> str | None:
    if item.answer is None or not normalize(item.answer):
        return f"item {item.id}: no gold answer to compare with"
    return None


def numeric_problem(item: Item, _argument: str | None = None) -> str | None:
    if item.answer is None or parse_number(item.answer) is None:
        return f"item {item.id}: gold answer {item.answer!r} is not a number"
    return None


def choice_problem(item: Item, _argument: str | None = None) -> str | None:
    if item.choices is not None and not 1 <= len(item.choices) <= len(LETTERS):
        return f"item {item.id}: multiple choice needs 1..{len(LETTERS)} choices"
    if gold_letter(item) is None:
        choices = f"{len(item.choices)} choices" if item.choices else f"letters {UNLISTED_LETTERS}"
        return f"item {item.id}: gold answer {item.answer!r} is none of the {choices}"
    return None


def regex_problem(item: Item, default: str | None = None) -> str | None:
    pattern, is_gold = pattern_for(item, default)
    if not pattern:
        return f"item {item.id}: no pattern (meta.regex, regex:<pattern> or a gold answer)"
    try:
        groups = re.compile(pattern).groups  # as the grader reads it (Python syntax)
    except re.error as exc:
        return f"item {item.id}: bad pattern {pattern!r}: {exc}"
    if groups and not is_gold and item.answer is None:
        return f"item {item.id}: pattern {pattern!r} extracts an answer, but the item has no gold answer"
    return None


def json_problem(item: Item, default: str | None = None) -> str | None:
    if item.answer is None:
        return f"item {item.id}: no gold answer to compare with"
    path = field_for(item, default)
    if path is not None:
        try:
            json_path(path)
        except ValueError as exc:
            return f"item {item.id}: {exc}"
    return None


def code_problem(item: Item, _argument: str | None = None) -> str | None:
    if not item.test or not item.entry_point:
        return f"item {item.id}: code execution needs `test` and `entry_point`"
    if not item.entry_point.isidentifier():
        return f"item {item.id}: entry_point {item.entry_point!r} is not a Python identifier"
    return None


def judge_problem(item: Item, spec: str | None = None) -> str | None:
    return None if spec else f"item {item.id}: the judge grader needs a model: judge:<model SPEC>"


def lm_eval_problem(item: Item, _argument: str | None = None) -> str | None:
    """The lm_eval grader: a gold answer (the task's target) and lm-eval's filters and
    exact_match options in meta.lm_eval, as `evalctl submit --task` writes them."""

    if item.answer is None:
        return f"item {item.id}: no gold answer (the task's target) to compare with"
    problem = meta_problem((item.meta or {}).get("lm_eval"))
    return f"item {item.id}: {problem}" if problem else None


# grader (canonical name) -> why an item cannot be graded by it (given the SPEC's argument), or None
ITEM_CHECKS: dict[str, Callable[[Item, str | None], str | None]] = {
    "exact": needs_gold,
    "numeric": numeric_problem,
    "choice": choice_problem,
    "regex": regex_problem,
    "contains": needs_gold,
    "json": json_problem,
    "code": code_problem,
    "judge": judge_problem,
    "loglikelihood": loglikelihood_problem,
    "perplexity": perplexity_problem,
    "lm_eval": lm_eval_problem,
}
assert set(ITEM_CHECKS) == set(GRADERS), "every registered grader has its item check"


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
    if item.answer is not None and parse_number(item.answer) is not None:
        return "numeric"
    return "exact"


def item_problem(spec: str, item: Item) -> str | None:
    """Why `item` cannot be graded by `spec` (after "auto" resolution), or None: lets a
    caller reject a dataset before grading starts instead of failing items one by one."""
    name, argument = split_grader(resolve_grader(spec, item))
    return ITEM_CHECKS[name](item, argument)
