"""Exact match after normalisation, for short free-text answers ("Paris", "George Washington").

The answer read from a response is its last non-empty line (short answers come alone, or
last after some working), normalised: case-folded, whitespace collapsed, a leading "the
answer is" / "answer:" dropped, surrounding quotes, markdown emphasis and trailing
punctuation stripped. It is correct when it equals the normalised gold answer.

One deliberate leniency: a single-word gold answer also counts when it appears as a whole
word in the response's first sentence, so that "The capital of France is Paris." is right
for "Paris" ("Parisian" is not). This accepts what instruction-tuned models naturally say,
at a known cost: "Paris is wrong; it is Lyon." would count for "Paris" too. Multi-word
answers get no such leniency: phrase matching inside sentences is too easy to fool.
"""

from __future__ import annotations

import re

from evalstream.common.gold import needs_gold as problem
from evalstream.common.gold import normalize
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response

GRADER_VERSION = GRADER_VERSIONS["exact"]  # bump it there: run manifests record it

_FIRST_SENTENCE_END = re.compile(r"(?<=[.!?])\s|\n")


def contains_word(text: str, word: str) -> bool:
    """`word` in `text` (both normalised) as a whole word: not inside a longer word, and a
    number not followed by its decimals ("42" is not in "42.5").

    str.find, not a regex: both sides are untrusted and may be long (a regex for the word
    compares it at every position of the text; find is linear in both)."""
    if not word:
        return False
    start = text.find(word)
    while start >= 0:
        end = start + len(word)
        if not (start and _is_word_char(text[start - 1])) and not _continues(text, end):
            return True
        start = text.find(word, start + 1)
    return False


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"  # Python's \w


def _continues(text: str, end: int) -> bool:
    """Whether text[end:] continues a word or a number ("42" followed by ".5" or ",000")."""
    if end >= len(text):
        return False
    return _is_word_char(text[end]) or (
        text[end] in ".," and end + 1 < len(text) and text[end + 1].isdecimal()
    )


def exact() -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item))
        gold = normalize(item.answer or "")
        text = clean_response(response)
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return Grade(extracted=None, correct=False, score=0.0, detail="empty response")
        extracted = normalize(lines[-1])
        if extracted == gold:
            return Grade(extracted=extracted, correct=True, score=1.0)
        first_sentence = normalize(_FIRST_SENTENCE_END.split(text, maxsplit=1)[0])
        if " " not in gold and contains_word(first_sentence, gold):
            detail = "gold answer found as a whole word in the first sentence"
            return Grade(extracted=extracted, correct=True, score=1.0, detail=detail)
        return Grade(extracted=extracted, correct=False, score=0.0, detail=f"expected {gold!r}")

    return grade
