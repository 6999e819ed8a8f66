"""Scoring pairs with their context run once (engines/shared_context.py) with a toy model:
each distinct context goes through one context pass, each continuation's tail is scored on
its own context's state, shapes are fixed per bucket, the sums are the whole-row sums, and
pairs whose context was cut (or a shared pass that fails) fall back to whole rows. Also the
model thread every engine call runs on (engines/model_thread.py)."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from evalstream.worker.batching import ScorePass
from evalstream.worker.engines.base import LLOutput, LLRequest
from evalstream.worker.engines.loglikelihood import score_row
from evalstream.worker.engines.model_thread import on_model_thread
from evalstream.worker.engines.shared_context import (
    CONTEXT_TOKENS_AT_ONCE,
    TailInputs,
    context_passes,
    shareable,
    split_contexts,
)
from evalstream.worker.engines.tokenizer_engine import TokenizerEngine
from tests.unit.scoring_items import ToyTokenizer

VOCAB = 128
FAVOURED = ord("a")  # every position's argmax: a target is greedy when it is "a"
LOGPROB_A = -math.log1p((VOCAB - 1) * math.exp(-10.0))  # log-softmax of the favoured token
LOGPROB_OTHER = LOGPROB_A - 10.0


def expected(targets: str) -> tuple[float, bool]:
    return sum(LOGPROB_A if c == "a" else LOGPROB_OTHER for c in targets), set(targets) <= {"a"}


class SharingToy(TokenizerEngine):
    """Logits favour "a" everywhere. The state of a context row is its length, so that a tail
    pass can check it got its own context's row. Records every pass's shape."""

    def __init__(self, context_window: int = 64, fail_tails: bool = False) -> None:
        self.tokenizer = ToyTokenizer()
        self.context_window = context_window
        self._lock = threading.Lock()
        self.score_pass_tokens, self.score_max_rows = 64, 4
        self.fail_tails = fail_tails
        self.context_rows: list[list[int]] = []
        self.context_shapes: list[tuple[int, int]] = []
        self.tail_shapes: list[tuple[int, int, int]] = []
        self.whole_rows = 0

    def _logits(self, *shape: int) -> Any:
        logits = torch.zeros(*shape, VOCAB)
        logits[..., FAVOURED] = 10.0
        return logits

    def _context_pass(self, input_ids: np.ndarray, lengths: Sequence[int]) -> tuple[Any, list[Any]]:
        assert all((row[n:] == 0).all() for row, n in zip(input_ids, lengths, strict=True))  # right-padded
        self.context_shapes.append(input_ids.shape)
        self.context_rows += [row[:n].tolist() for row, n in zip(input_ids, lengths, strict=True)]
        return self._logits(len(lengths)), [torch.tensor([[n] for n in lengths])]

    def _tail_pass(self, state: list[Any], inputs: TailInputs) -> Any:
        if self.fail_tails:
            raise RuntimeError("toy device fault")
        rows, width = inputs.input_ids.shape
        context_width = inputs.attention_mask.shape[1] - width
        lengths = state[0][:, 0].tolist()  # each row on its own context's state
        assert (inputs.position_ids[:, 0] == lengths).all()
        for row, n in enumerate(lengths):  # its context's real tokens, then its tail
            assert inputs.attention_mask[row].tolist() == [1] * n + [0] * (context_width - n) + [1] * width
        self.tail_shapes.append((rows, context_width, width))
        return self._logits(rows, width)

    def _score_pass(self, score_pass: ScorePass, rows: Sequence[Any]) -> list[tuple[float, bool]]:
        self.whole_rows += len(rows)
        return [expected("".join(chr(t) for t in r.targets)) for r in rows]


def test_each_distinct_context_runs_once_and_sums_match_whole_rows() -> None:
    engine = SharingToy()
    requests = [
        LLRequest("q1", "Question one?", choice, i) for i, choice in enumerate([" a", " ba", " aaaa", " b"])
    ] + [LLRequest("q2", "Another question, longer?", choice, i) for i, choice in enumerate([" aa", " xyz"])]
    outs = engine.loglikelihood(requests)
    for request, out in zip(requests, outs, strict=True):
        assert isinstance(out, LLOutput), out
        ll, greedy = expected(request.continuation)  # the toy tokenises " a" as " ", "a"
        assert out.loglikelihood == pytest.approx(ll, rel=1e-6) and out.is_greedy == greedy
    real = {tuple(c) for c in engine.context_rows}
    assert real == {tuple(map(ord, "Question one?")), tuple(map(ord, "Another question, longer?"))}
    assert engine.whole_rows == 0
    # shapes depend on buckets alone: 64 tokens / width 16 or 32 -> 4 or 2 rows, fillers included
    assert set(engine.context_shapes) == {(4, 16), (2, 32)}
    assert all(rows * width <= 64 or rows == 1 for rows, _, width in engine.tail_shapes)


def test_a_pairs_numbers_do_not_depend_on_its_call() -> None:
    requests = [
        LLRequest(f"q{i}", f"Context number {i}?", c, j)
        for i in range(7)
        for j, c in enumerate([" ab", " b"])
    ]
    together_engine, alone_engine = SharingToy(), SharingToy()
    together = together_engine.loglikelihood(requests)
    alone = [alone_engine.loglikelihood([r])[0] for r in requests]
    assert [o.loglikelihood for o in together] == [o.loglikelihood for o in alone]  # type: ignore[union-attr]
    # a pass's shape is its buckets' however many rows were real: 16 tail rows of 1 or 2
    # tokens after 24-token contexts, 2 context rows of 24 (fillers included)
    assert set(alone_engine.tail_shapes) == set(together_engine.tail_shapes) == {(16, 24, 1), (16, 24, 2)}
    assert set(alone_engine.context_shapes) == set(together_engine.context_shapes) == {(2, 24)}


def test_cut_contexts_run_as_whole_rows_and_a_failing_shared_pass_falls_back() -> None:
    engine = SharingToy(context_window=8)
    cut, fits = engine.loglikelihood([LLRequest("x", "a" * 20, " b"), LLRequest("y", "abc", " a")])
    assert isinstance(cut, LLOutput) and cut.truncated and engine.whole_rows >= 1
    assert isinstance(fits, LLOutput) and fits.loglikelihood == pytest.approx(expected(" a")[0])
    failing = SharingToy(fail_tails=True)
    (out,) = failing.loglikelihood([LLRequest("x", "abc", " ab")])
    assert isinstance(out, LLOutput) and out.loglikelihood == pytest.approx(expected(" ab")[0])
    assert failing.whole_rows >= 1  # scored after all, as a whole row


def test_planning_helpers() -> None:
    rows = [score_row(i, list(map(ord, c)), list(map(ord, k)), 64) for i, (c, k) in enumerate(
        [("ctx", " a"), ("ctx", " bb"), ("other", " c")]
    )]  # fmt: skip
    assert all(shareable(r) for r in rows)
    contexts, shared = split_contexts(rows, [0, 1, 2])
    assert [len(c) for c in contexts] == [3, 5] and [s.context for s in shared] == [0, 0, 1]
    assert [s.tail for s in shared] == [[ord(" ")], [ord(" "), ord("b")], [ord(" ")]]
    chunks = list(context_passes([[1] * 5] * 4000 + [[1] * 20] * 3, pass_tokens=64, max_rows=4, cap=None))
    assert all(len({p.width for p in chunk}) == 1 for chunk in chunks)  # one width per chunk
    assert max(sum(p.size * p.width for p in chunk) for chunk in chunks) <= CONTEXT_TOKENS_AT_ONCE
    assert sum(len(p.rows) for chunk in chunks for p in chunk) == 4003


def test_every_call_runs_on_one_model_thread() -> None:
    seen: set[int] = set()

    def where() -> int:
        seen.add(threading.get_ident())
        return on_model_thread(threading.get_ident)  # reentrant: runs at once

    threads = [threading.Thread(target=lambda: on_model_thread(where)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1 and threading.get_ident() not in seen


def test_scoring_calls_are_larger_than_generation_batches() -> None:
    from types import SimpleNamespace

    from evalstream.worker.runner import ModelRunner, RunnerConfig
    from evalstream.worker.runner.model_runner import SCORING_CALL_FACTOR

    runner = ModelRunner(RunnerConfig(group="g"), lambda _spec: None, None)  # type: ignore[arg-type,return-value]
    engine = SimpleNamespace(name="hf:/models/x", device="cpu")
    _, max_items = RunnerConfig(group="g").batch_limits("hf:/models/x", "cpu")
    lengths = [10] * (max_items * SCORING_CALL_FACTOR + 1)
    generation = runner.plan(engine, lengths)
    scoring = runner.plan(engine, lengths, scoring=True)
    assert max(len(b) for b in generation) == max_items
    assert [len(b) for b in scoring] == [max_items * SCORING_CALL_FACTOR, 1]
