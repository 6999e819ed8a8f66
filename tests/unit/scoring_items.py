"""A multiple-choice item and the scores a worker records for it, as the scoring tests
(tests/unit/test_scoring_grading.py, tests/unit/test_scoring_engines.py) write them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evalstream.common import scoring
from evalstream.common.messages import Item


def mc_item(**overrides: Any) -> Item:
    fields: dict[str, Any] = {
        "id": "q1",
        "question": "Question: Which is a colour?\nAnswer:",
        "choices": ["red", "a table", "blue-green"],
        "answer": "2",
        "meta": {"lm_eval": {"target_delimiter": " ", "output_type": "multiple_choice"}},
    }
    return Item(**{**fields, **overrides})


def scores(lls: Sequence[float], greedy: Sequence[bool] | None = None) -> str:
    return scoring.encode_scores(
        scoring.ChoiceScores(
            loglikelihoods=list(lls), is_greedy=list(greedy or [False] * len(lls)), tokens=[1] * len(lls)
        )
    )
