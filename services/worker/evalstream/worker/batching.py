"""Dynamic batching plans: pure functions, so that the policy is unit-tested on its own.

A batch costs about (longest prompt + tokens to generate) × rows positions of attention and
KV cache, since left padding stretches every row to the longest prompt. Sorting by prompt
length before cutting keeps similar lengths together and so limits the padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


# ---- log-likelihood scoring passes -----------------------------------------------------------
#
# A row's log-likelihood must not depend on what else an engine call scores. On the CPU,
# transformers' fp32 numbers for a row do depend on the shape of the pass it is in (how many
# rows, how wide: BLAS and attention kernels block and thread by shape), though not on the
# other rows' contents or the row's place. So a pass's shape is made a function of the row
# alone: its width is the row's length rounded up to a bucket, its logits kept per row are the
# scored length rounded up to a bucket, and its number of rows is fixed per width (a last pass
# short of rows is filled with repeats of its first row). The same request then gives the same
# number, bit for bit, in any call.


def score_bucket(n: int, cap: int | None = None, *, min_step: int = 8) -> int:
    """n rounded up to a step of an eighth to a quarter of n (at least `min_step`): a padded
    length wastes at most a quarter; never above `cap` (the context window), never below n."""
    if n < 1:
        raise ValueError(f"a scoring row has at least one token, got {n}")
    step = max(min_step, 1 << max(0, (n - 1).bit_length() - 3))
    bucket = -(-n // step) * step
    return max(n, min(bucket, cap)) if cap is not None else bucket


@dataclass(frozen=True)
class ScorePass:
    width: int  # every row padded (on the right) to this many tokens
    keep: int  # logits kept per row: its last `keep` positions (its scored ones, and some before)
    rows: list[int]  # indices of the real rows
    size: int  # rows of the pass, fillers included: fixed per width

    @property
    def fillers(self) -> int:
        return self.size - len(self.rows)


def rows_per_pass(width: int, *, pass_tokens: int, max_rows: int) -> int:
    """A pass's rows for a width: as many as fit `pass_tokens`, at most `max_rows`, at least 1."""
    return max(1, min(max_rows, pass_tokens // width))


def plan_score_passes(
    lengths: Sequence[int],
    scored: Sequence[int],
    *,
    pass_tokens: int,
    max_rows: int,
    cap: int | None = None,
    min_step: int = 8,
) -> list[ScorePass]:
    """Forward passes for rows of `lengths` tokens whose last `scored` positions are scored:
    rows grouped by (width bucket, kept-logits bucket), shortest first, in passes of a fixed
    number of rows per width. A pass's shape depends on nothing but the bucket of each of its
    rows, so a row's numbers do not depend on the other rows of the call."""
    if pass_tokens < 1 or max_rows < 1:
        raise ValueError(f"need pass_tokens and max_rows >= 1, got {pass_tokens}, {max_rows}")
    if len(scored) != len(lengths):
        raise ValueError(f"{len(scored)} scored counts for {len(lengths)} rows")
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (n, k) in enumerate(zip(lengths, scored, strict=True)):
        if not 1 <= k <= n:
            raise ValueError(f"row {i}: {k} scored positions of {n}")
        width = score_bucket(n, cap, min_step=min_step)
        groups.setdefault((width, min(width, score_bucket(k, min_step=min_step))), []).append(i)
    passes = []
    for (width, keep), members in sorted(groups.items()):
        size = rows_per_pass(width, pass_tokens=pass_tokens, max_rows=max_rows)
        for start in range(0, len(members), size):
            passes.append(ScorePass(width, keep, members[start : start + size], size))
    return passes
