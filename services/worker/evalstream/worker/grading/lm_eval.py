"""lm-eval's grading of a `generate_until` task (the `lm_eval` grader): the task's filter
pipelines (RegexFilter, take_first) on the raw answer, each scored with the task's
exact_match options against the target (evalstream.common.lmeval_filters, lm-eval 0.4.13's
rules; the item's `meta.lm_eval` holds them, as `evalctl submit --task` renders them).

The first pipeline's result is the item's grade (gsm8k's strict-match), as the run's headline;
`detail` holds every pipeline's (JSON: {"filters": [{"name", "extracted", "correct"}]}), which
the run summary reports one by one as lm-eval does (strict-match, flexible-extract). The
response is not cleaned: lm-eval searches the model's text as it is (no reasoning blocks or
fences stripped). The task's patterns are untrusted: they run on RE2 where it reads them as
Python does, else in Python's engine under the grading pool's per-item deadline (patterns.py).
"""

from __future__ import annotations

from evalstream.common.evidence import MAX_DETAIL_CHARS
from evalstream.common.gold import lm_eval_problem as problem
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.lmeval_filters import encode_detail
from evalstream.common.lmeval_filters import grade as filtered_grades
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.patterns import compile_pattern

GRADER_VERSION = GRADER_VERSIONS["lm_eval"]  # bump it there: run manifests record it


def lm_eval() -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item))
        assert item.meta is not None and item.answer is not None  # checked by problem()
        grades = filtered_grades(response, item.meta["lm_eval"], item.answer, compile_pattern=compile_pattern)
        first = grades[0]
        return Grade(
            extracted=first.extracted,
            correct=first.correct,
            score=float(first.correct),
            detail=encode_detail(grades, MAX_DETAIL_CHARS),
        )

    return grade
