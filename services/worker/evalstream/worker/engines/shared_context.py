"""Scoring (context, continuation) pairs with the context run once: a multiple-choice item's
choices share their question, so its tokens go through the model once, not once per choice
(MMLU's one-token answers need nothing more; BIG-bench's dates need ~3x fewer tokens).

Two kinds of pass, both of a fixed shape per length bucket (batching.plan_score_passes), so
that a pair's numbers depend on nothing but the pair (the answer cache stays exact):

* a **context pass** runs distinct contexts, right-padded, without a mask (lm-eval's way: a
  row's real tokens never see the padding after them): the logits at each context's last
  token (they score the continuation's first token) and the key/value state of every row;
* a **tail pass** runs continuations but their last token ("tails") on top of the state of
  their contexts (of one context width), each row masked to its own context's real tokens
  and positioned after them: the logits that score the rest of the continuation.

The sums are lm-eval's (loglikelihood.sum_logprobs). Pairs whose context was cut to fit the
window are not shared: they go through the engine's whole-row passes. The engine runs the two
passes (SharedContextModel); this module plans them and puts the scores together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from evalstream.worker.batching import ScorePass, plan_score_passes
from evalstream.worker.engines.loglikelihood import ScoreRow, sum_logprobs

# context tokens (padded) whose states are kept at once, at least one pass: the tail passes
# of their continuations are filled from all of them (fewer rows computed only to keep the
# shape fixed); SmolLM2-135M's state is 46 KB a token in fp32, a 7B model's ~130 KB in bf16
CONTEXT_TOKENS_AT_ONCE = 8192
TAIL_ROWS_FACTOR = 4  # a tail pass may hold this many times a whole-row pass's rows (short rows)
# tails are short (a choice's tokens): padded to a step of 1 up to 8 tokens, then an eighth
# (whole rows step by 8 at least: 9-token tails would be 16 wide)
TAIL_MIN_STEP = 1


@dataclass(frozen=True)
class TailInputs:
    """A tail pass's inputs: each row masked to its own context's real tokens (the padding
    after them in the state is not seen) and positioned after them."""

    input_ids: np.ndarray  # rows x width: the tails, right-padded
    attention_mask: np.ndarray  # rows x (context width + width)
    position_ids: np.ndarray  # rows x width

    @classmethod
    def of(
        cls,
        tails: Sequence[list[int]],
        context_lengths: Sequence[int],
        context_width: int,
        width: int,
        pad: int,
    ) -> TailInputs:
        mask = np.ones((len(tails), context_width + width), dtype=np.int64)
        for row, n in enumerate(context_lengths):
            mask[row, n:context_width] = 0
        positions = np.asarray(context_lengths, dtype=np.int64)[:, None] + np.arange(width, dtype=np.int64)
        return cls(right_padded(tails, width, pad), mask, positions)


def right_padded(rows: Sequence[list[int]], width: int, pad: int) -> np.ndarray:
    """Rows of token ids padded on the right to `width` (int64)."""
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, ids in enumerate(rows):
        out[i, : len(ids)] = ids
    return out


class SharedContextModel(Protocol):
    """The two passes an engine runs (torch tensors out, on the CPU or the device)."""

    pad_id: int

    def _context_pass(self, input_ids: np.ndarray, lengths: Sequence[int]) -> tuple[Any, list[Any]]:
        """(logits at each row's last real token: rows x vocabulary, the key/value state: a
        list of batch-first tensors) of right-padded contexts run without a mask."""
        ...

    def _tail_pass(self, state: list[Any], inputs: TailInputs) -> Any:
        """Logits (rows x width x vocabulary) of the tails, row i on top of state row i."""
        ...


@dataclass(frozen=True)
class SharedRow:
    """A pair scored through its context's state."""

    row: int  # its index in the call's rows
    context: int  # its context's index
    tail: list[int]  # the continuation but its last token: the tail pass's input
    targets: list[int]


def shareable(row: ScoreRow) -> bool:
    """A pair whose row holds its whole context (not cut to fit the window)."""
    return not row.truncated and 0 < row.context_tokens <= len(row.ids)


def split_contexts(
    rows: Sequence[ScoreRow], indices: Sequence[int]
) -> tuple[list[list[int]], list[SharedRow]]:
    """The distinct contexts of the rows at `indices`, and each row's part."""
    contexts: dict[tuple[int, ...], int] = {}
    shared: list[SharedRow] = []
    for i in indices:
        row = rows[i]
        context = tuple(row.ids[: row.context_tokens])
        index = contexts.setdefault(context, len(contexts))
        shared.append(SharedRow(i, index, row.ids[row.context_tokens :], row.targets))
    return [list(c) for c in contexts], shared


def context_passes(
    contexts: Sequence[list[int]], *, pass_tokens: int, max_rows: int, cap: int | None
) -> Iterator[list[ScorePass]]:
    """The context passes, those of one width together, at most CONTEXT_TOKENS_AT_ONCE."""
    plan = plan_score_passes(
        [len(c) for c in contexts], [1] * len(contexts), pass_tokens=pass_tokens, max_rows=max_rows, cap=cap
    )
    chunk: list[ScorePass] = []
    for p in plan:
        full = sum(q.size * q.width for q in chunk) + p.size * p.width > CONTEXT_TOKENS_AT_ONCE
        if chunk and (p.width != chunk[0].width or full):
            yield chunk
            chunk = []
        chunk.append(p)
    if chunk:
        yield chunk


def filled(members: Sequence[int], size: int) -> list[int]:
    """A pass's members repeated from the first up to its fixed size."""
    return [*members, *[members[0]] * (size - len(members))]


def score_shared(
    model: SharedContextModel,
    rows: Sequence[ScoreRow],
    indices: Sequence[int],
    *,
    pass_tokens: int,
    max_rows: int,
    cap: int | None,
) -> dict[int, tuple[float, bool]]:
    """(log-likelihood, greedy) of each shareable row at `indices`, by row index."""
    import torch

    contexts, shared = split_contexts(rows, indices)
    by_context: dict[int, list[SharedRow]] = {}
    for s in shared:
        by_context.setdefault(s.context, []).append(s)
    out: dict[int, tuple[float, bool]] = {}
    for chunk in context_passes(contexts, pass_tokens=pass_tokens, max_rows=max_rows, cap=cap):
        width = chunk[0].width
        slot: dict[int, int] = {}  # context -> its row in the chunk's states, one after the other
        firsts, states = [], []
        for p in chunk:
            padded = filled(p.rows, p.size)
            rows_in = [contexts[c] for c in padded]
            first, state = model._context_pass(
                right_padded(rows_in, width, model.pad_id), [len(c) for c in rows_in]
            )
            for c in p.rows:
                slot[c] = len(slot)
            firsts.append(first[: len(p.rows)])
            states.append([t[: len(p.rows)] for t in state])
        first_logits = torch.cat(firsts)
        state_rows = [torch.cat(parts) for parts in zip(*states, strict=True)]
        members = [s for p in chunk for c in p.rows for s in by_context[c]]
        tails = [s for s in members if s.tail]
        tail_plan = plan_score_passes(
            [len(s.tail) for s in tails],
            [len(s.tail) for s in tails],
            pass_tokens=pass_tokens,
            max_rows=max_rows * TAIL_ROWS_FACTOR,
            min_step=TAIL_MIN_STEP,
        )
        for p in tail_plan:
            part = [tails[i] for i in filled(p.rows, p.size)]
            picked = torch.tensor([slot[s.context] for s in part], device=first_logits.device)
            inputs = TailInputs.of(
                [s.tail for s in part], [len(contexts[s.context]) for s in part], width, p.width, model.pad_id
            )
            result = model._tail_pass([t.index_select(0, picked) for t in state_rows], inputs)
            for k, s in enumerate(part[: len(p.rows)]):  # summed now: a pass's logits are large
                kept = torch.cat([first_logits[slot[s.context]][None], result[k, : len(s.tail)]])
                [out[s.row]] = sum_logprobs(kept, [s.targets])
        for s in members:
            if not s.tail:  # a one-token continuation: the context pass scored it
                [out[s.row]] = sum_logprobs(first_logits[slot[s.context]][None], [s.targets])
    return out
