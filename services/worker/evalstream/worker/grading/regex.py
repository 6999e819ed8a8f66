"""Regular expressions (Python `re` syntax), searched in the cleaned response.

The pattern is the item's `meta.regex`, else the job's (`regex:<pattern>`), else the gold
answer itself (answer patterns, as TREC QA sets ship them). Then:

* a pattern with a capturing group *extracts* the answer: the first group of its last match,
  which must equal the gold answer after the normalisation `exact` uses (a job's
  `regex:Answer:\\s*(\\w+)` over items with gold answers);
* a pattern without groups, or the gold answer used as the pattern, must simply be found.

Matching is case-sensitive unless the pattern says otherwise ("(?i)"); anchor with ^ and $
(multiline is not set: they match the ends of the whole response). Patterns are untrusted:
they run on RE2 where it reads them as Python does, else under the grading pool's deadline
(patterns.py).
"""

from __future__ import annotations

from evalstream.common.gold import normalize, pattern_for
from evalstream.common.gold import regex_problem as problem
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import clean_response
from evalstream.worker.grading.patterns import compile_pattern

GRADER_VERSION = GRADER_VERSIONS["regex"]  # bump it there: run manifests record it


def regex(default: str | None = None) -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item, default))
        pattern, is_gold = pattern_for(item, default)
        assert pattern is not None  # checked by problem()
        compiled = compile_pattern(pattern)
        matches = compiled.finditer(clean_response(response))
        first = next(matches, None)
        if first is None:
            return Grade(extracted=None, correct=False, score=0.0, detail=f"no match for {pattern!r}")
        if is_gold or not compiled.groups:
            return Grade(extracted=first[0], correct=True, score=1.0)
        last = first
        for last in matches:  # noqa: B007 (only the last one counts: no list of every match)
            pass
        extracted = last[1] or ""
        correct = normalize(extracted) == normalize(item.answer or "")
        detail = None if correct else f"expected {item.answer!r}"
        return Grade(extracted=extracted, correct=correct, score=float(correct), detail=detail)

    return grade
