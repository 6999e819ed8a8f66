"""Dynamic batching plans: pure functions, so that the policy is unit-tested on its own.

A batch costs about (longest prompt + tokens to generate) × rows positions of attention and
KV cache, since left padding stretches every row to the longest prompt. Sorting by prompt
length before cutting keeps similar lengths together and so limits the padding.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_batches(
    lengths: Sequence[int],
    *,
    token_budget: int,
    max_items: int,
    max_new_tokens: int | Sequence[int] = 0,
) -> list[list[int]]:
    """Indices into `lengths` (prompt lengths in tokens), cut into batches, shortest prompts
    first, such that (longest prompt + most new tokens in the batch) × batch size <=
    token_budget and batch size <= max_items. A request that alone exceeds the budget still
    gets a batch of its own: it must run somewhere (the engine truncates or fails it).
    `max_new_tokens` is one value for all requests or one per request."""
    if token_budget < 1 or max_items < 1:
        raise ValueError(f"token_budget and max_items must be >= 1, got {token_budget}, {max_items}")
    if any(n < 0 for n in lengths):
        raise ValueError("prompt lengths must be >= 0")
    new = [max_new_tokens] * len(lengths) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(new) != len(lengths):
        raise ValueError(f"{len(new)} max_new_tokens values for {len(lengths)} prompts")
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = most_new = 0
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        grown_longest, grown_new = max(longest, lengths[i]), max(most_new, new[i])
        fits = (grown_longest + grown_new) * (len(batch) + 1) <= token_budget and len(batch) < max_items
        if batch and not fits:
            batches.append(batch)
            batch, grown_longest, grown_new = [], lengths[i], new[i]
        batch.append(i)
        longest, most_new = grown_longest, grown_new
    if batch:
        batches.append(batch)
    return batches


def padding_ratio(lengths: Sequence[int]) -> float:
    """Share of the positions of a left-padded batch that are padding (0.0 for no waste)."""
    if not lengths or max(lengths) == 0:
        return 0.0
    return 1.0 - sum(lengths) / (max(lengths) * len(lengths))
