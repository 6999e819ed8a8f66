"""Log-likelihood scoring without a model (issue 24), how scores are made: the pass plans
whose shape depends on each row alone, lm-eval's tokenisation split and rolling windows, the
null/replay/test-hook engines' scoring, the runner's scoring path with a scripted engine, and
the shared tokenizer engine's passes with a toy model. The graders and metrics:
tests/unit/test_scoring_grading.py; the real model's numbers: tests/model/test_scoring_model.py."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from evalstream.common.messages import GenerationParams, Item, Shard
from evalstream.worker.batching import ScorePass, plan_score_passes, rows_per_pass, score_bucket
from evalstream.worker.cache import CachedAnswer
from evalstream.worker.engines import EngineConfigError
from evalstream.worker.engines.base import (
    EngineError,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    TransientEngineError,
)
from evalstream.worker.engines.loglikelihood import encode_pair, rolling_windows, score_row
from evalstream.worker.engines.null import NullEngine
from evalstream.worker.engines.replay import ReplayEngine
from evalstream.worker.engines.testhooks import ChaosEngine
from evalstream.worker.engines.tokenizer_engine import TokenizerEngine
from evalstream.worker.runner import ModelRunner, RunnerConfig
from tests.unit.scoring_items import ToyTokenizer, mc_item, scores

# ---- passes and tokenisation -------------------------------------------------------------------


def test_buckets_waste_at_most_a_quarter() -> None:
    for n in range(1, 20000, 7):
        b = score_bucket(n)
        assert n <= b <= max(n + 7, n * 1.25), n
    assert score_bucket(9000, cap=8192) == 9000 and score_bucket(8100, cap=8192) == 8192
    assert score_bucket(8100, cap=8150) == 8150


def test_a_pass_shape_depends_on_the_row_alone() -> None:
    rng = random.Random(4)
    rows = [(rng.randrange(1, 900), 0) for _ in range(300)]
    rows = [(n, rng.randrange(1, n + 1)) for n, _ in rows]

    def shapes(indices: list[int]) -> dict[int, tuple[int, int, int]]:
        plan = plan_score_passes(
            [rows[i][0] for i in indices], [rows[i][1] for i in indices], pass_tokens=256, max_rows=16
        )
        out: dict[int, tuple[int, int, int]] = {}
        for p in plan:
            assert 1 <= len(p.rows) <= p.size == rows_per_pass(p.width, pass_tokens=256, max_rows=16)
            assert p.size * p.width <= 256 or p.size == 1
            for r in p.rows:
                n, k = rows[indices[r]]
                assert n <= p.width and k <= p.keep <= p.width
                out[indices[r]] = (p.width, p.keep, p.size)
        assert sorted(out) == sorted(indices)  # every row once
        return out

    everything = shapes(list(range(len(rows))))
    for _ in range(5):
        subset = rng.sample(range(len(rows)), 40)
        assert all(everything[i] == s for i, s in shapes(subset).items())
    with pytest.raises(ValueError):
        plan_score_passes([5], [6], pass_tokens=256, max_rows=16)
    assert ScorePass(64, 8, [0, 1], 4).fillers == 2


def test_encode_pair_moves_the_contexts_trailing_spaces_to_the_continuation() -> None:
    def encode(text: str) -> list[int]:  # a toy tokenizer: a space joins the word after it
        return [hash(w) % 1000 for w in text.replace(" ", "\x00 ").split("\x00") if w]

    ctx, cont = encode_pair(encode, "Answer:  ", "Paris")
    assert ctx == encode("Answer:") and cont == encode("Answer:  Paris")[len(ctx) :]


def test_rolling_windows_predict_every_token_once_with_the_most_context() -> None:
    tokens = list(range(100, 123))
    windows = rolling_windows(tokens, prefix_token=1, max_length=8)
    predicted = [t for _, p in windows for t in p]
    assert predicted == tokens
    assert windows[0] == ([1], tokens[:8])  # made disjoint: the prefix alone, then 8 predicted
    for context, predict in windows:
        assert len(context) + len(predict) <= 8 + 1 and len(predict) <= 8
    assert windows[1] == ([tokens[7]], tokens[8:16])
    assert rolling_windows([], 1, 8) == [] and rolling_windows([5], 1, 8) == [([1], [5])]


def test_score_row_is_lm_evals_input_and_truncates_the_context_from_the_left() -> None:
    row = score_row(0, [1, 2, 3], [4, 5], max_length=16)
    assert (row.ids, row.targets, row.truncated) == ([1, 2, 3, 4], [4, 5], False)
    cut = score_row(0, list(range(10)), [90, 91], max_length=6)
    assert cut.ids == [5, 6, 7, 8, 9, 90] and cut.truncated and len(cut.ids) == 6
    with pytest.raises(PermanentEngineError):
        score_row(0, [1], [], max_length=6)
    with pytest.raises(PermanentEngineError):
        score_row(0, [1], list(range(7)), max_length=6)


# ---- engines without a model ---------------------------------------------------------------


def test_null_engine_scores_zeros() -> None:
    outs = NullEngine().loglikelihood([LLRequest("a", "ctx", " x"), LLRequest("a", "ctx", " y", index=1)])
    assert [(o.loglikelihood, o.is_greedy) for o in outs if isinstance(o, LLOutput)] == [(0.0, False)] * 2
    (doc,) = NullEngine().loglikelihood_rolling([RollingRequest("d", "one two")])
    assert isinstance(doc, LLOutput) and doc.loglikelihood == 0.0


def test_replay_engine_serves_recorded_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "scores.jsonl"
    lines = [
        {"id": "q1", "loglikelihoods": [-1.5, -0.25], "is_greedy": [False, True]},
        {"id": 7, "loglikelihoods": [-3]},
        {"id": "doc", "loglikelihood": -120.75},
        {"id": "gen", "response": "Paris"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setenv("REPLAY_ROOT", str(tmp_path))
    engine = _replay(path, tmp_path)
    outs = engine.loglikelihood(
        [LLRequest("q1", "c", " a"), LLRequest("q1", "c", " b", index=1), LLRequest("7", "c", " a"),
         LLRequest("q1", "c", " z", index=2), LLRequest("gen", "c", " a"), LLRequest("nope", "c", " a")]
    )  # fmt: skip
    good = [(o.loglikelihood, o.is_greedy) for o in outs[:3] if isinstance(o, LLOutput)]
    assert good == [(-1.5, False), (-0.25, True), (-3.0, False)]
    assert all(isinstance(o, PermanentEngineError) for o in outs[3:])
    (doc, missing) = engine.loglikelihood_rolling(
        [RollingRequest("doc", "text"), RollingRequest("q1", "text")]
    )
    assert isinstance(doc, LLOutput) and doc.loglikelihood == -120.75
    assert isinstance(missing, PermanentEngineError)
    for bad in ({"id": "x", "loglikelihoods": [0.5]}, {"id": "x", "loglikelihoods": [-1], "is_greedy": [1]},
                {"id": "x", "loglikelihood": "low"}, {"id": "x", "loglikelihoods": []}):  # fmt: skip
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(EngineConfigError):
            _replay(path, tmp_path)


def _replay(path: Path, root: Path) -> ReplayEngine:
    """The replay engine of `path`, whichever constructor this checkout's replay.py has."""
    try:
        return ReplayEngine(path.name, root=str(root))  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return ReplayEngine(path)  # type: ignore[call-arg,unused-ignore]


def test_chaos_engine_fails_planned_scoring_requests() -> None:
    engine = ChaosEngine(NullEngine(), "permanent=0.5,seed=3")
    requests = [LLRequest(f"i{i}", "c", " x") for i in range(20)]
    outs = engine.loglikelihood(requests)
    planned = [engine.planned_failure(r.item_id, 1) for r in requests]
    assert [isinstance(o, PermanentEngineError) for o in outs] == [p == "permanent" for p in planned]
    assert 0 < planned.count("permanent") < 20


# ---- the runner ----------------------------------------------------------------------------


class ScriptedScorer(NullEngine):
    """Log-likelihood = -(length of the continuation) unless scripted; records every call."""

    name = "hf:scripted"
    revision = "rev-1"
    cacheable = True
    device = "cpu"

    def __init__(self, failures: dict[tuple[str, int], EngineError] | None = None) -> None:
        self.calls: list[list[LLRequest]] = []
        self.documents: list[list[RollingRequest]] = []
        self.failures = failures or {}

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        self.calls.append(requests)
        return [
            self.failures.get((r.item_id, r.index))
            or LLOutput(-float(len(r.continuation)), r.index == 0, prompt_tokens=5, scored_tokens=2)
            for r in requests
        ]

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        self.documents.append(requests)
        return [
            LLOutput(-2.0 * len(r.text.split()), False, scored_tokens=len(r.text.split())) for r in requests
        ]


def shard(items: list[Item], grader: str = "loglikelihood", **extra: Any) -> Shard:
    return Shard(
        run_id="run-s", shard_id="run-s-s00000", shard_index=0, shard_count=1, model="hf:scripted",
        grader=grader, generation=GenerationParams(), items=items, **extra,
    )  # fmt: skip


class MemoryCache:
    def __init__(self) -> None:
        self.entries: dict[str, CachedAnswer] = {}

    async def get_many(self, keys: list[str]) -> dict[str, CachedAnswer]:
        return {k: self.entries[k] for k in keys if k in self.entries}

    async def put_many(self, entries: list[tuple[str, str, CachedAnswer]]) -> None:
        for key, _model, answer in entries:
            self.entries.setdefault(key, answer)


def run(engine: ScriptedScorer, shards: list[Shard], cache: MemoryCache | None = None) -> Any:
    runner = ModelRunner(RunnerConfig(group="g"), lambda _spec: engine, cache)  # type: ignore[arg-type]
    return asyncio.run(runner.run(shards))


def test_runner_scores_each_choice_after_the_raw_question() -> None:
    engine = ScriptedScorer()
    item = mc_item(choices=["red", "a table", "xy"], answer="2")
    # a prompt template and a system prompt are the generation's: never applied to scoring
    out = run(engine, [shard([item], prompt_template="Q: {question} A:", system_prompt="Be brief.")])
    (requests,) = engine.calls
    assert sorted((r.index, r.context, r.continuation) for r in requests) == [
        (0, item.question, " red"), (1, item.question, " a table"), (2, item.question, " xy")
    ]  # fmt: skip
    (result,) = out.results["run-s-s00000"]
    assert json.loads(result.response) == {
        "loglikelihoods": [-4.0, -8.0, -3.0], "is_greedy": [True, False, False], "tokens": [2, 2, 2]
    }  # fmt: skip
    assert (result.extracted, result.correct, result.score) == ("xy", True, 1.0)
    # per character: -4/3, -8/7, -3/2: "a table" is acc_norm's pick, not the gold
    assert result.correct_norm is False and result.loglikelihood == -3.0
    assert result.prompt == item.question and result.served_by == "g/hf:scripted"
    assert (result.prompt_tokens, result.completion_tokens) == (15, 6)


def test_runner_scores_documents_for_perplexity() -> None:
    engine = ScriptedScorer()
    out = run(
        engine,
        [shard([Item(id="d1", question="one two three"), Item(id="d2", question="four")], "perplexity")],
    )
    assert engine.calls == [] and sorted(r.text for call in engine.documents for r in call) == [
        "four",
        "one two three",
    ]
    results = {r.item_id: r for r in out.results["run-s-s00000"]}
    assert (
        results["d1"].loglikelihood == -6.0 and results["d1"].doc_words == 3 and results["d1"].doc_bytes == 13
    )
    assert results["d1"].correct is None and results["d2"].loglikelihood == -2.0


def test_a_failed_choice_fails_its_item_and_a_permanent_failure_wins() -> None:
    failures: dict[tuple[str, int], EngineError] = {
        ("a", 1): TransientEngineError("busy"),
        ("b", 0): TransientEngineError("busy"),
        ("b", 2): PermanentEngineError("too long"),
    }
    out = run(ScriptedScorer(failures), [shard([mc_item(id="a"), mc_item(id="b"), mc_item(id="c")])])
    failed = {f.item.id: f for f in out.failures}
    assert failed["a"].transient and not failed["b"].transient and "too long" in failed["b"].error
    assert [r.item_id for r in out.results["run-s-s00000"]] == ["c"]


def test_scores_are_cached_per_request_and_shared_between_items() -> None:
    cache = MemoryCache()
    first = ScriptedScorer()
    run(first, [shard([mc_item(id="a")])], cache)
    assert len(cache.entries) == 3 and sum(len(c) for c in first.calls) == 3
    again = ScriptedScorer()
    # another item with the same context and two of the same choices: only the new one is scored
    out = run(again, [shard([mc_item(id="b", choices=["red", "a table", "green"], answer="0")])], cache)
    assert [r.continuation for c in again.calls for r in c] == [" green"]
    (result,) = out.results["run-s-s00000"]
    assert result.cache_hit is False and result.correct is True
    third = ScriptedScorer()
    out = run(third, [shard([mc_item(id="c")])], cache)
    assert third.calls == [] and out.results["run-s-s00000"][0].cache_hit
    # a reproduction never reads the cache
    fourth = ScriptedScorer()
    run(fourth, [shard([mc_item(id="d")], bypass_cache=True)], cache)
    assert sum(len(c) for c in fourth.calls) == 3


def test_an_engine_that_cannot_score_fails_the_items_for_good() -> None:
    class GenerateOnly:
        name, revision, cacheable, device = "hf:old", "r", False, "cpu"

        def render_prompt(self, messages: Any) -> str:
            return ""

        def count_tokens(self, text: str) -> int:
            return 1

    runner = ModelRunner(RunnerConfig(group="g"), lambda _spec: GenerateOnly(), None)  # type: ignore[arg-type,return-value]
    out = asyncio.run(runner.run([shard([mc_item()])]))
    (failure,) = out.failures
    assert not failure.transient and "does not score log-likelihoods" in failure.error


def test_a_regrade_grades_recorded_scores_without_an_engine() -> None:
    from evalstream.common.messages import StoredAnswer

    recorded = StoredAnswer(item_id="q1", response=scores([-9.0, -1.0, -5.0]), served_by="g/hf:x")
    out = run(ScriptedScorer(), [shard([mc_item()], answers=[recorded])])
    (result,) = out.results["run-s-s00000"]
    assert result.extracted == "a table" and result.correct is False and result.loglikelihood == -5.0


# ---- the shared tokenizer engine's scoring, with a toy model -----------------------------------


class ToyEngine(TokenizerEngine):
    """A pass scores each target token -1 (greedy when it is a vowel); records the passes'
    shapes; runs out of memory on passes of more than `fits` rows. Whole rows only (shared
    contexts: test_shared_context.py)."""

    shares_contexts = False

    def __init__(self, context_window: int = 64, fits: int = 99) -> None:
        self.tokenizer = ToyTokenizer()
        self.context_window = context_window
        self._lock = threading.Lock()
        self.score_pass_tokens, self.score_max_rows = 64, 4
        self.fits = fits
        self.shapes: list[tuple[int, int, int]] = []

    def _score_pass(self, score_pass: ScorePass, rows: Sequence[Any]) -> list[tuple[float, bool]]:
        if len(rows) > self.fits:
            raise MemoryError("toy out of memory")
        self.shapes.append((len(rows), score_pass.width, score_pass.keep))
        return [(-float(len(r.targets)), all(chr(t) in "aeiou" for t in r.targets)) for r in rows]


def test_passes_are_filled_to_their_size_and_split_when_out_of_memory() -> None:
    engine = ToyEngine()
    outs = engine.loglikelihood(
        [LLRequest("a", "abc", " de"), LLRequest("b", "xy", "a"), LLRequest("c", "", "q")]
    )
    assert [(o.loglikelihood, o.is_greedy) for o in outs if isinstance(o, LLOutput)] == [
        (-3.0, False), (-1.0, True), (-1.0, False)
    ]  # fmt: skip
    assert {rows for rows, _, _ in engine.shapes} == {4}  # 64 tokens / width 8: 4 rows, fillers included
    small = ToyEngine(fits=1)
    outs = small.loglikelihood([LLRequest("a", "abc", " de"), LLRequest("b", "xyz", "ab")])
    assert [o.loglikelihood for o in outs if isinstance(o, LLOutput)] == [-3.0, -2.0]
    assert (1, 8, 8) in small.shapes and all(rows == 1 for rows, _, _ in small.shapes)


def test_rolling_documents_sum_their_windows_and_bad_requests_fail_alone() -> None:
    engine = ToyEngine(context_window=8)
    doc = "abcdefghijklmnopqrst"  # 20 tokens: windows of 8
    outs = engine.loglikelihood_rolling([RollingRequest("d", doc), RollingRequest("e", "")])
    first, empty = outs
    assert isinstance(first, LLOutput) and first.loglikelihood == -20.0 and first.scored_tokens == 20
    assert isinstance(empty, PermanentEngineError)
    (too_long,) = engine.loglikelihood([LLRequest("x", "ab", "c" * 9)])
    assert isinstance(too_long, PermanentEngineError) and "exceed" in str(too_long)
    (cut,) = engine.loglikelihood([LLRequest("x", "a" * 20, " b")])
    assert isinstance(cut, LLOutput) and cut.truncated and cut.scored_tokens == 2
