"""Log-likelihood scoring without a model (issue 24): the graders `loglikelihood` and
`perplexity` (lm-eval 0.4.13's process_results rules), the run metrics (its aggregations and
standard errors), the score cache key and entries, the pass plans whose shape depends on each
row alone, lm-eval's tokenisation split and rolling windows, the null/replay/test-hook
engines' scoring, the runner's scoring path with a scripted engine, and the item page's table
of choices. The real model's numbers are tests/model/test_scoring.py's."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from evalstream.common import scoring
from evalstream.common.analysis import items_html
from evalstream.common.analysis.reports import scores_from_sums
from evalstream.common.gold import item_problem, resolve_grader
from evalstream.common.graders import grader_version
from evalstream.common.keys import cache_key, score_cache_key
from evalstream.common.messages import GenerationParams, Item, Shard
from evalstream.worker.batching import ScorePass, plan_score_passes, rows_per_pass, score_bucket
from evalstream.worker.cache import CachedAnswer, score_entry, score_from_entry
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
from evalstream.worker.grading import GradingError, get_grader
from evalstream.worker.runner import ModelRunner, RunnerConfig

# ---- the graders ---------------------------------------------------------------------------


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


class TestLoglikelihoodGrader:
    grade = staticmethod(get_grader("loglikelihood"))

    def test_acc_picks_the_highest_loglikelihood(self) -> None:
        g = self.grade(scores([-1.0, -5.0, -2.0]), mc_item())
        assert (g.extracted, g.correct, g.score) == ("red", False, 0.0)
        assert g.loglikelihood == -2.0  # the gold choice's
        assert "expected choice 2, picked 0" in (g.detail or "")

    def test_acc_norm_divides_by_the_choices_characters_without_the_delimiter(self) -> None:
        # per character: red -1/3 = -0.333, "a table" -5/7, "blue-green" -2/10 = -0.2: the gold
        g = self.grade(scores([-1.0, -5.0, -2.0]), mc_item())
        assert g.correct is False and g.correct_norm is True
        # with the delimiter counted (4, 8, 11 characters) "red" would win: -0.25 > -2/11
        assert scoring.argmax([-1.0 / 4, -5.0 / 8, -2.0 / 11]) == 2
        right = self.grade(scores([-3.0, -5.0, -2.0]), mc_item())
        assert (right.correct, right.score, right.correct_norm, right.extracted) == (
            True,
            1.0,
            True,
            "blue-green",
        )

    def test_ties_go_to_the_first_choice_as_numpys_argmax(self) -> None:
        g = self.grade(scores([-2.0, -2.0, -2.0]), mc_item(choices=["ab", "cd", "ef"], answer="1"))
        assert g.extracted == "ab" and g.correct is False and g.correct_norm is False

    def test_one_continuation_is_right_when_greedy(self) -> None:
        item = mc_item(choices=["dog"], answer="0", meta={"lm_eval": {"target_delimiter": ""}})
        greedy = self.grade(scores([-0.4], [True]), item)
        assert (greedy.correct, greedy.score, greedy.correct_norm, greedy.loglikelihood) == (
            True,
            1.0,
            None,
            -0.4,
        )
        not_greedy = self.grade(scores([-0.4], [False]), item)
        assert not_greedy.correct is False and "greedy" in (not_greedy.detail or "")

    def test_gold_by_index_or_by_the_exact_text_of_a_choice(self) -> None:
        assert scoring.gold_index(mc_item(answer=" 1 ")) == 1
        assert scoring.gold_index(mc_item(answer="a table")) == 1
        assert scoring.gold_index(mc_item(answer="3")) is None
        assert scoring.gold_index(mc_item(answer="Red")) is None

    def test_items_it_cannot_grade(self) -> None:
        assert item_problem("loglikelihood", mc_item()) is None
        assert "choices" in (item_problem("loglikelihood", mc_item(choices=None)) or "")
        assert "not the index" in (item_problem("loglikelihood", mc_item(answer="7")) or "")
        assert "empty continuation" in (
            item_problem(
                "loglikelihood",
                mc_item(choices=["a", ""], answer="0", meta={"lm_eval": {"target_delimiter": ""}}),
            )
            or ""
        )
        with pytest.raises(GradingError):
            self.grade(scores([-1.0]), mc_item(answer="9"))

    def test_a_response_that_is_not_the_items_scores_is_an_error(self) -> None:
        for response in ("B", scores([-1.0, -2.0]), scores([-1.0, 0.5, -2.0]), '{"loglikelihoods": "x"}'):
            with pytest.raises(GradingError):
                self.grade(response, mc_item())

    def test_evidence_lists_every_choice(self) -> None:
        g = self.grade(scores([-1.0, -5.0, -2.0], [True, False, False]), mc_item())
        ev = scoring.read_evidence(g.evidence)
        assert ev is not None and ev.choices is not None
        assert (ev.scoring, ev.gold, ev.pred, ev.pred_norm, ev.target_delimiter) == (
            "multiple_choice",
            2,
            0,
            2,
            " ",
        )
        assert [(c.text, c.chars, c.loglikelihood, c.is_greedy) for c in ev.choices] == [
            ("red", 3, -1.0, True),
            ("a table", 7, -5.0, False),
            ("blue-green", 10, -2.0, False),
        ]
        # hundreds of long choices still give evidence that reads back (texts clipped)
        many = mc_item(choices=[f"choice {i} " + "x" * 300 for i in range(40)], answer="3")
        big = self.grade(scores([-float(i) for i in range(40)]), many)
        assert big.evidence is not None and len(big.evidence) <= 8000 and scoring.read_evidence(big.evidence)

    def test_never_picked_by_auto_and_versioned(self) -> None:
        assert resolve_grader("auto", mc_item()) == "choice"
        assert grader_version("loglikelihood") == "loglikelihood/1 clean/1"
        assert grader_version("perplexity") == "perplexity/1 clean/1"


class TestPerplexityGrader:
    grade = staticmethod(get_grader("perplexity"))

    def test_words_and_bytes_as_lm_eval_counts_them(self) -> None:
        doc = "Ünïcode text,\n  with  spaces "
        g = self.grade(
            scoring.encode_scores(scoring.RollingScore(loglikelihood=-42.5, tokens=9)),
            Item(id="d", question=doc),
        )
        # lm-eval: len(re.split(r"\s+", doc)) counts the empty string after the trailing space
        assert g.doc_words == 5 and g.doc_bytes == len(doc.encode()) == 31
        assert (g.ungraded, g.score, g.loglikelihood, g.extracted) == (True, 0.0, -42.5, None)
        ev = scoring.read_evidence(g.evidence)
        assert ev is not None and (ev.loglikelihood, ev.tokens, ev.words, ev.bytes) == (-42.5, 9, 5, 31)

    def test_refuses_what_is_not_a_document_score(self) -> None:
        with pytest.raises(GradingError):
            self.grade(scores([-1.0]), Item(id="d", question="doc"))
        with pytest.raises(GradingError):
            self.grade('{"loglikelihood": 1.5, "tokens": 2}', Item(id="d", question="doc"))
        assert item_problem("perplexity", Item(id="d", question="")) is not None


# ---- run metrics -------------------------------------------------------------------------------


def lm_eval_mean_stderr(values: list[float]) -> float:
    """lm_eval.api.metrics.mean_stderr, as it is written there."""
    mu = sum(values) / len(values)
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (len(values) - 1)) / math.sqrt(len(values))


def test_mean_with_interval_is_lm_evals_stderr_and_a_normal_interval() -> None:
    values = [1.0] * 37 + [0.0] * 63
    m = scoring.mean_with_interval(sum(values), len(values))
    assert m["value"] == 0.37 and m["n"] == 100
    assert m["stderr"] == pytest.approx(lm_eval_mean_stderr(values), abs=1e-6)
    assert m["ci95"] == pytest.approx([0.37 - 1.96 * m["stderr"], 0.37 + 1.96 * m["stderr"]], abs=2e-4)
    assert scoring.mean_with_interval(1, 1) == {"value": 1.0, "stderr": None, "ci95": None, "n": 1}
    assert scoring.mean_with_interval(0, 0)["value"] is None
    assert scoring.mean_with_interval(10, 10)["ci95"] == [1.0, 1.0]


def test_perplexities_are_lm_evals_aggregations() -> None:
    # weighted_perplexity = exp(-sum(ll) / sum(weight)); bits_per_byte = -sum(ll) / sum(bytes) / ln 2
    docs = [(-100.0, 20, 90), (-30.5, 7, 31)]
    ll, words, n_bytes = (sum(d[i] for d in docs) for i in range(3))
    got = scoring.rolling_metrics(ll, int(words), int(n_bytes))
    assert got["word_perplexity"] == pytest.approx(math.exp(130.5 / 27))
    assert got["byte_perplexity"] == pytest.approx(math.exp(130.5 / 121))
    assert got["bits_per_byte"] == pytest.approx(130.5 / 121 / math.log(2))
    assert scoring.perplexity_of_mean(-3.0, 2) == pytest.approx(math.exp(1.5))


def test_report_scores_section() -> None:
    sums = {
        "scored": 10, "mc_acc_sum": 6.0, "mc_n": 10, "mc_norm_sum": 7, "one_acc_sum": 0.0, "one_n": 0,
        "one_ll_sum": 0.0, "docs": 0, "doc_ll_sum": 0.0, "words": 0, "bytes": 0,
    }  # fmt: skip
    mc = scores_from_sums("loglikelihood", sums)
    assert mc["acc"]["value"] == 0.6 and mc["acc_norm"]["value"] == 0.7 and "perplexity" not in mc
    one = scores_from_sums(
        "loglikelihood", {**sums, "mc_n": 0, "one_n": 4, "one_acc_sum": 3.0, "one_ll_sum": -2.0}
    )
    assert (
        one["acc"]["value"] == 0.75
        and one["perplexity"] == pytest.approx(math.exp(0.5))
        and "acc_norm" not in one
    )
    ppl = scores_from_sums("perplexity", {**sums, "docs": 2, "doc_ll_sum": -130.5, "words": 27, "bytes": 121})
    assert ppl["word_perplexity"] == pytest.approx(math.exp(130.5 / 27)) and ppl["documents"] == 2


# ---- cache keys and entries --------------------------------------------------------------------


def test_score_keys_never_collide_with_answers_or_each_other() -> None:
    base = {
        "model": "hf:m",
        "model_revision": "r1",
        "kind": "loglikelihood",
        "context": "ab",
        "continuation": " c",
    }
    key = score_cache_key(**base)
    assert key == score_cache_key(**base)  # deterministic
    others = [
        {**base, "context": "a", "continuation": "b c"},  # the same text split elsewhere
        {**base, "context": "ab c", "continuation": ""},
        {**base, "model_revision": "r2"},
        {**base, "model": "hf:n"},
        {**base, "kind": "loglikelihood_rolling/8192"},
    ]
    assert len({key, *(score_cache_key(**o) for o in others)}) == len(others) + 1
    assert key != cache_key(model="hf:m", model_revision="r1", generation={}, prompt="ab c")


def test_score_cache_entries_read_back_bit_for_bit() -> None:
    out = LLOutput(-12.345678901234567, True, prompt_tokens=30, scored_tokens=4, truncated=True)
    again = score_from_entry(score_entry(out))
    assert again is not None and again.loglikelihood == out.loglikelihood
    assert (again.is_greedy, again.prompt_tokens, again.scored_tokens, again.truncated) == (True, 30, 4, True)
    assert score_from_entry(CachedAnswer("Paris", 3, 1)) is None  # an answer, not a score: a miss
    assert (
        score_from_entry(CachedAnswer('{"loglikelihood": NaN, "is_greedy": true, "truncated": false}', 1, 1))
        is None
    )


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


# ---- the item page -----------------------------------------------------------------------------


def test_the_item_page_shows_each_choice_with_its_loglikelihood() -> None:
    hostile = "<script>alert(1)</script>"
    grade = get_grader("loglikelihood")(
        scores([-1.0, -5.0, -2.0]), mc_item(choices=["red", hostile, "blue-green"])
    )
    row = {"item_id": "q1", "outcome": 1, "response": "{}", "evidence": grade.evidence, "question": "Q"}
    page = items_html.item_sections(row)
    assert "id='choices'" in page and "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<tr class='choice") == 3 and "acc pick" in page and "acc_norm pick" in page
    assert "-1</td>" in page or "-1.0" in page or "-1<" in page
    doc = get_grader("perplexity")(
        scoring.encode_scores(scoring.RollingScore(loglikelihood=-30.0, tokens=12)),
        Item(id="d", question="a b c"),
    )
    page = items_html.item_sections({"item_id": "d", "outcome": 2, "evidence": doc.evidence})
    assert "id='scores'" in page and "word perplexity" in page and f"{math.exp(10):.6g}" in page
    # another grader's evidence stays as it is
    assert "id='choices'" not in items_html.item_sections({"item_id": "x", "evidence": '{"stdout": "ok"}'})


def test_score_records_are_strict_json() -> None:
    with pytest.raises(ValueError):
        scoring.decode_choice_scores('{"loglikelihoods": [-1.0], "is_greedy": [true]}', 1)
    assert msgspec.json.decode(scores([-1.5]))["loglikelihoods"] == [-1.5]


# ---- the shared tokenizer engine's scoring, with a toy model -----------------------------------


class ToyTokenizer:
    """One token per character (id = code point), BOS 1 never added, pad 0."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i > 2)


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
