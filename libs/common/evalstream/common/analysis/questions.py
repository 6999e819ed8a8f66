"""When two items ask "the same question", and two answers are "the same answer": one rule
for the producer's dataset checks (a repeated question with another gold answer is a
warning, evalstream.common.datasets.scan) and the label audit (conflicting duplicates,
evalstream.common.analysis.audit), so that both find the same pairs.

Case (Unicode case folding), spacing and end punctuation do not count; a text that is a
number compares by value ("1,000", "1000" and "1000.0" are one answer). Light: the producer
imports it."""

from __future__ import annotations

import hashlib
import string

import msgspec

from evalstream.common.messages import Item

_END_PUNCTUATION = (
    string.punctuation + " \u00bf\u00a1\u2026\u201c\u201d\u2018\u2019\u00ab\u00bb\u3002\uff1f\uff01"
)

QuestionKey = tuple[str, tuple[str, ...] | None]


def normalise(text: str) -> str:
    """Case, spacing and end punctuation do not count; numbers compare by value."""
    if text.isdigit() and text.isascii() and len(text) < 16:  # the usual numeric answer, exact
        return str(int(text))
    text = " ".join(text.casefold().split()).strip(_END_PUNCTUATION)
    # After the strip (signs and "." are punctuation) float() reads only text that starts
    # with a decimal digit, or "inf"/"nan": anything else is refused here without raising.
    if not (text[:1].isdecimal() or text[:1] in ("i", "n")):
        return text
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)


def question_text(item: Item) -> str:
    """What an item asks: its question, or its chat messages one per line."""
    if item.messages is not None:
        return "\n".join(f"{m.role}: {m.content}" for m in item.messages)
    return item.question or ""


def question_key(item: Item) -> QuestionKey:
    """Items with equal keys ask the same question (with the same choices, in order)."""
    return normalise(question_text(item)), tuple(item.choices) if item.choices else None


def question_key_digest(item: Item) -> bytes:
    """16 bytes from the same parts as question_key, without building it (the dataset
    check takes one per item): equal keys give equal digests, and a match of digests is
    only a candidate, to confirm on the keys."""
    digest = hashlib.blake2b(normalise(question_text(item)).encode(), digest_size=16)
    if item.choices:
        digest.update(b"\x00" + msgspec.json.encode(item.choices))
    return digest.digest()
