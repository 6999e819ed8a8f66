"""A multiple-choice item and the scores a worker records for it, as the scoring tests
(tests/unit/test_scoring_grading.py, tests/unit/test_scoring_engines.py) write them, and the
toy tokenizer their engines use (also tests/unit/test_shared_context.py)."""

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


class ToyTokenizer:
    """One token per character (id = code point), BOS 1 never added, pad 0."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i > 2)
