"""The gold answer appears in the response, as a whole phrase: case-folded, whitespace
collapsed, not inside a longer word or number ("Paris" is not in "Parisian", "42" not in
"420" or "42.5"). For free-form answers where the right fact is enough, wherever it is said.
"""

from __future__ import annotations

from evalstream.common.gold import needs_gold as problem
from evalstream.common.gold import normalize
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response
from evalstream.worker.grading.exact import contains_word

GRADER_VERSION = GRADER_VERSIONS["contains"]  # bump it there: run manifests record it


def contains() -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item))
        gold = normalize(item.answer or "")
        text = " ".join(clean_response(response).split()).casefold()
        if contains_word(text, gold):
            return Grade(extracted=gold, correct=True, score=1.0)
        return Grade(extracted=None, correct=False, score=0.0, detail=f"{gold!r} not in the response")

    return grade
