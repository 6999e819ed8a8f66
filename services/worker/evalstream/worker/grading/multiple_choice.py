"""Multiple choice (the `choice` grader): which lettered choice (A, B, ...) a response picks.

An item lists its `choices`, or none when they are written into the question itself: its
letters are then A-E. The gold answer is a letter ("B", "(b)"), the text of a choice, or a 0-based index ("1", as
in MMLU/HellaSwag exports) when no choice has that text. From the response, in this order:
a lone letter ("B", "(B)", "b."); the last "answer (is|:) B", else the last "option/choice B";
a leading "B) ...", "(B) ...", "B. ..."; the text of exactly one choice (all of it, or as a
phrase inside the response). Letters inside prose count only in capitals, and only those of
the item's choices, so that "a" or "I" in a sentence is never read as a choice.
"""

from __future__ import annotations

import re

from evalstream.common.gold import LETTERS, LONE_LETTER, gold_letter, letters_of, normalize
from evalstream.common.gold import choice_problem as problem
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response
from evalstream.worker.grading.exact import contains_word

GRADER_VERSION = GRADER_VERSIONS["choice"]  # bump it there: run manifests record it


def marked_letters(text: str, marker: str, letters: str) -> list[str]:
    """Every letter that follows `marker` ("answer is B", "option: (C)"), left to right.

    Possessive (*+, ?+): no part gives back what it took, so a long run of spaces after
    "answer" costs one pass, not one per way of splitting it between the \\s* (54 s for
    "The answer" + 3000 spaces with plain *). No match is lost: what one part would give
    back, the next cannot take (a space is not "is", ":" or a letter)."""
    letter = f"([{letters}])(?![\\w'])"  # a capital standing alone: not "As", not "A's"
    return re.findall(rf"(?i:{marker})\s*+(?:is\b|:)?+\s*+[:\-]?+\s*+[(\[*]*+{letter}", text)


def extract_letter(text: str, choices: list[str], letters: str | None = None) -> str | None:
    """The letter `text` picks among `letters` (default: one per choice)."""
    letters = letters or LETTERS[: len(choices)]
    if m := LONE_LETTER.fullmatch(text):
        return m[1].upper() if m[1].upper() in letters else None
    letter = f"([{letters}])(?![\\w'])"  # a capital standing alone: not "As", not "A's"
    for marker in ("answer", "option|choice"):  # "the answer is C, not option A" means C
        marked = marked_letters(text, marker, letters)
        if marked:
            return marked[-1]
    if m := re.match(rf"[(\[]?{letter}[)\].:]", text):
        return m[1]
    said = normalize(text)
    texts = [normalize(choice) for choice in choices]
    if said in texts:
        return letters[texts.index(said)]
    inside = [letters[i] for i, t in enumerate(texts) if t and contains_word(said, t)]
    return inside[0] if len(inside) == 1 else None


def multiple_choice() -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item))
        gold = gold_letter(item)
        extracted = extract_letter(clean_response(response), item.choices or [], letters_of(item))
        if extracted is None:
            return Grade(extracted=None, correct=False, score=0.0, detail="no choice found in the response")
        correct = extracted == gold
        detail = None if correct else f"expected {gold}"
        return Grade(extracted=extracted, correct=correct, score=float(correct), detail=detail)

    return grade
