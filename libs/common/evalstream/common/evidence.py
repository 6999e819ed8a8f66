"""What a stored item result keeps besides the answer, so that a reader can judge it: the
question and gold answer, the prompt as the model saw it, the grader's detail and its
evidence (a code test's output). Every field is bounded here, in one place, because each
one is stored per item in PostgreSQL and in the Parquet mirror."""

from __future__ import annotations

from evalstream.common.messages import Item

MAX_QUESTION_CHARS = 4_000
MAX_GOLD_CHARS = 2_000
MAX_PROMPT_CHARS = 16_000
MAX_DETAIL_CHARS = 2_000
MAX_EVIDENCE_CHARS = 8_000
CLIP_MARK = "\n[… {more} more characters not stored]"


def clip(text: str | None, limit: int) -> str | None:
    """`text` cut to `limit` characters, saying how much was left out."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + CLIP_MARK.format(more=len(text) - limit)


def question_of(item: Item) -> str | None:
    """The question as a reader knows it: the item's question, else its last user message."""
    if item.question is not None:
        return clip(item.question, MAX_QUESTION_CHARS)
    for message in reversed(item.messages or []):
        if message.role == "user":
            return clip(message.content, MAX_QUESTION_CHARS)
    return None


def gold_of(item: Item) -> str | None:
    return clip(item.answer, MAX_GOLD_CHARS)
