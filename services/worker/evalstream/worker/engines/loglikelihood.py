"""Log-likelihood scoring as lm-evaluation-harness 0.4.13 tokenises and windows it, for the
engines that hold a tokenizer (hf:, ov:): a (context, continuation) pair encoded as lm-eval
encodes it, a document cut into lm-eval's rolling windows, each made into one forward pass
row, and the log-softmax of a row's targets summed (in fp32) as lm-eval sums it.

Pure but for sum_logprobs, which imports torch when it is called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evalstream.worker.engines.base import PermanentEngineError

LOG_SOFTMAX_CHUNK = 1024  # positions normalised at once


def encode_pair(
    encode: Callable[[str], list[int]], context: str, continuation: str
) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair for a causal model: the context's trailing spaces
    move to the continuation, context + continuation is encoded whole and the continuation's
    tokens are what follows the context's own encoding."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids) :]


def rolling_windows(
    tokens: list[int], prefix_token: int, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """lm-eval's get_rolling_token_windows(context_len=1) through make_disjoint_window:
    (context, tokens to predict) pairs that predict every token once, the first one
    conditioned on `prefix_token`, each with as much of the preceding text as fits."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    out: list[tuple[list[int], list[int]]] = []
    if not tokens:
        return out
    first = min(max_length, len(tokens))
    windows = [([prefix_token, *tokens[: first - 1]], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, max_length)
        end = predicted + n
        windows.append((tokens[max(0, end - max_length - 1) : end - 1], tokens[end - n : end]))
        predicted += n
    for context, predict in windows:  # make_disjoint_window
        out.append((context[: len(context) - (len(predict) - 1)], predict))
    return out


@dataclass(frozen=True)
class ScoreRow:
    """One forward pass row: the model's input and the tokens its last positions predict."""

    owner: int  # the request it belongs to
    ids: list[int]  # (context + continuation)[-(max_length + 1):][:-1], as lm-eval feeds it
    targets: list[int]  # the continuation, predicted by the last len(targets) positions
    context_tokens: int  # before truncation
    truncated: bool


def score_row(owner: int, context: list[int], continuation: list[int], max_length: int) -> ScoreRow:
    """The row lm-eval's _loglikelihood_tokens makes of a (context, continuation) pair, the
    context cut from the left when the pair is longer than the context window."""
    if not continuation:
        raise PermanentEngineError(
            "the continuation has no tokens of its own (the tokenizer merged it into the context)"
        )
    if len(continuation) > max_length:
        raise PermanentEngineError(
            f"the continuation's {len(continuation)} tokens exceed the model's context window of {max_length}"
        )
    whole = context + continuation
    ids = whole[-(max_length + 1) :][:-1]
    return ScoreRow(owner, ids, continuation, len(context), len(whole) > max_length + 1)


def sum_logprobs(logits: Any, targets: Sequence[list[int]]) -> list[tuple[float, bool]]:
    """(sum of log-softmax at the targets, every target the argmax) per row, from the kept
    logits of all rows one after the other (positions x vocabulary), as lm-eval computes
    them: log_softmax over the vocabulary, gathered, summed in one float32 sum per row."""
    import torch

    out: list[tuple[float, bool]] = []
    offset = 0
    for row in targets:
        wanted = torch.tensor(row, dtype=torch.long, device=logits.device)
        picked, greedy = [], True
        for start in range(0, len(row), LOG_SOFTMAX_CHUNK):
            end = min(start + LOG_SOFTMAX_CHUNK, len(row))
            # in fp32 whatever the model's dtype (a bf16 log-softmax loses ~3 digits; lm-eval
            # keeps the logits' dtype unless told otherwise: the same on the CPU's fp32)
            chunk = torch.log_softmax(logits[offset + start : offset + end].float(), dim=-1)
            part = wanted[start:end]
            picked.append(chunk.gather(1, part[:, None]).squeeze(1))
            greedy = greedy and bool((chunk.argmax(dim=-1) == part).all())
        out.append((float(torch.cat(picked).float().sum()), greedy))
        offset += len(row)
    if offset != logits.shape[0]:
        raise RuntimeError(f"{logits.shape[0]} logit rows for {offset} scored positions")
    return out
