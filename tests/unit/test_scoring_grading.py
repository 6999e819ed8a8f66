"""Log-likelihood scoring without a model (issue 24), what is made of the scores: the graders
`loglikelihood` and `perplexity` (lm-eval 0.4.13's process_results rules), the run metrics (its
aggregations and standard errors), the score cache key and entries, and the item page's table
of choices. How scores are made: tests/unit/test_scoring_engines.py; the real model's numbers:
tests/model/test_scoring_model.py."""

from __future__ import annotations

import math

import msgspec
import pytest

from evalstream.common import scoring
from evalstream.common.analysis import items_html
from evalstream.common.analysis.reports import scores_from_sums
from evalstream.common.gold import item_problem, resolve_grader
from evalstream.common.graders import grader_version
from evalstream.common.keys import cache_key, score_cache_key
from evalstream.common.messages import Item
from evalstream.worker.cache import CachedAnswer, score_entry, score_from_entry
from evalstream.worker.engines.base import LLOutput
from evalstream.worker.grading import GradingError, get_grader
from tests.unit.scoring_items import mc_item, scores

# ---- the graders ---------------------------------------------------------------------------


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
