"""The reliability-aware gold audit: the EM estimator (evalstream.common.analysis.reliability) on simulated
answers whose truth is known, and its use by `evalctl audit` (observations, flags, ranking,
threshold, partial runs)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from evalstream.common.analysis.audit import (
    AGREEMENT,
    MAJORITY,
    audit,
    observations,
    q_values,
    reliability_flags,
)
from evalstream.common.analysis.reliability import CATEGORICAL, Observation, estimate
from evalstream.common.messages import Item
from tests.unit.test_audit import grade_replay, items_of, planted_dataset, recall_precision

LETTERS = "ABCD"


def simulate_open(
    accuracies: dict[str, float], n: int = 600, error_rate: float = 0.08, seed: int = 1
) -> tuple[list[Observation], set[str]]:
    """Numeric answers: a right model says the truth, a wrong one a nearby number."""
    rng = random.Random(seed)
    obs, errors = [], set()
    for i in range(n):
        truth = rng.randint(1000, 9999)
        gold = truth
        if rng.random() < error_rate:
            gold = truth + rng.choice([-2, -1, 1, 2, 10])
            errors.add(f"i{i}")
        answers = {
            m: str(truth if rng.random() < acc else truth + rng.randint(1, 40) * rng.choice([-1, 1]))
            for m, acc in accuracies.items()
        }
        obs.append(Observation(f"i{i}", str(gold), answers, "numeric"))
    return obs, errors


def test_an_always_wrong_model_is_learned_as_such() -> None:
    obs, _ = simulate_open({"good-1": 0.85, "good-2": 0.8, "always-wrong": 0.0})
    est = estimate(obs)
    assert est.accuracy["always-wrong"] < 0.03
    assert est.accuracy["good-1"] == pytest.approx(0.85, abs=0.04)
    assert est.accuracy["good-2"] == pytest.approx(0.8, abs=0.04)
    assert est.gold_accuracy == pytest.approx(0.92, abs=0.03)


def test_an_always_wrong_chooser_is_learned_with_its_confusion() -> None:
    """Multiple choice: a model that always answers the letter after the right one has accuracy
    0 and a confusion matrix that says so, and then even helps: with it, an item where the
    other model is wrong is still read right."""
    rng = random.Random(3)
    obs, errors = [], set()
    for i in range(800):
        truth = rng.randrange(4)
        gold = truth if rng.random() > 0.08 else (truth + rng.randrange(1, 4)) % 4
        if gold != truth:
            errors.add(f"c{i}")
        fair = truth if rng.random() < 0.75 else rng.choice([x for x in range(4) if x != truth])
        answers = {"fair": LETTERS[fair], "shifted": LETTERS[(truth + 1) % 4]}
        obs.append(Observation(f"c{i}", LETTERS[gold], answers, CATEGORICAL, 4))
    est = estimate(obs)
    assert est.accuracy["shifted"] < 0.03 and est.accuracy["fair"] == pytest.approx(0.75, abs=0.05)
    confusion = est.confusion["shifted"]
    for truth in range(4):
        assert confusion[truth][(truth + 1) % 4] > 0.9
    flagged = {i for i, s in est.scores.items() if s >= 0.5}
    recall, precision = recall_precision(flagged, errors)
    assert recall >= 0.85 and precision >= 0.95, (recall, precision)
    # it is the shifted model's answers that find them: the fair model alone finds none
    alone = estimate(
        [Observation(o.item_id, o.gold, {"fair": o.answers["fair"]}, o.kind, o.options) for o in obs]
    )
    assert recall_precision({i for i, s in alone.scores.items() if s >= 0.5}, errors)[0] < 0.2
    # the suggested gold of a flagged item is the truth the shifted model points at
    some = next(iter(flagged & errors))
    said = next(o for o in obs if o.item_id == some).answers["shifted"]
    assert said is not None
    assert est.suggested[some][0] == LETTERS[(LETTERS.index(said) - 1) % 4]


def test_a_single_confident_model_does_not_outvote_three_consistent_ones() -> None:
    accuracies = {"confident": 0.97, "m1": 0.75, "m2": 0.75, "m3": 0.75}
    obs, _ = simulate_open(accuracies, n=800, seed=5)
    est_background = estimate(obs)
    assert est_background.accuracy["confident"] > est_background.accuracy["m1"] + 0.1
    three = {"m1": "500", "m2": "500", "m3": "500"}
    probes = [
        # the three agree with the gold, the confident model says something else: gold stands
        Observation("gold-with-three", "500", {**three, "confident": "501"}, "numeric"),
        # the confident model agrees with the gold, the three agree on another answer: flagged
        Observation("gold-with-confident", "501", {**three, "confident": "501"}, "numeric"),
    ]
    est = estimate([*obs, *probes])
    assert est.scores["gold-with-three"] < 0.05
    assert est.scores["gold-with-confident"] > 0.5
    assert est.suggested["gold-with-confident"][0] == "500"


def test_reliability_beats_the_majority_where_fewer_than_two_models_are_right() -> None:
    """Items no model agrees with the gold on, while the models disagree among themselves: the
    majority vote cannot see them; the estimate scores them by each model's reliability."""
    accuracies = {"a": 0.9, "b": 0.85, "c": 0.8}
    obs, errors = simulate_open(accuracies, n=1000, error_rate=0.08, seed=7)
    est = estimate(obs)
    flagged = {i for i, s in est.scores.items() if s >= 0.5}
    recall, precision = recall_precision(flagged, errors)
    assert recall >= 0.97 and precision >= 0.9
    scattered = [o for o in obs if o.item_id in errors and len(set(o.answers.values())) == 3]
    assert scattered  # the items a majority misses are there ...
    assert all(est.scores[o.item_id] >= 0.5 for o in scattered if o.gold not in o.answers.values())


def test_partial_runs_count_where_they_answered() -> None:
    """Two complete runs and one that answered only the first half: its accuracy comes from its
    half; items it did not answer are scored from the others; a run that is missing an item is
    no evidence against the gold, and an item no model answered gets no flag."""
    obs, errors = simulate_open({"a": 0.9, "b": 0.85, "half": 0.8}, n=1000, seed=11)
    partial = [
        Observation(o.item_id, o.gold, {m: a for m, a in o.answers.items() if m != "half" or k < 500}, o.kind)
        for k, o in enumerate(obs)
    ]
    partial.append(Observation("unanswered", "7", {}, "numeric"))
    est = estimate(partial)
    assert est.accuracy["half"] == pytest.approx(0.8, abs=0.05)
    assert est.accuracy["a"] == pytest.approx(0.9, abs=0.04)
    assert est.scores["unanswered"] < 0.5
    flagged = {i for i, s in est.scores.items() if s >= 0.5}
    # three models on the first half, two on the second: fewer voices, less precision there
    for half, least_precision in ((range(500), 0.9), (range(500, 1000), 0.75)):
        ids = {f"i{k}" for k in half}
        recall, precision = recall_precision(flagged & ids, errors & ids)
        assert recall >= 0.9 and precision >= least_precision, (half, recall, precision)
    # the full audit too: a partial run's missing items are no flags, its answers count
    items = [Item(id=o.item_id, question=o.item_id, answer=o.gold) for o in partial]
    runs = {
        m: {
            o.item_id: {"extracted": o.answers[m], "correct": o.answers[m] == o.gold, "error": None}
            for o in partial
            if m in o.answers
        }
        for m in ("a", "b", "half")
    }
    flags, _ = reliability_flags(items, runs, grader="numeric")
    assert "unanswered" not in {f.item_ids[0] for f in flags}
    late = next(f for f in flags if f.item_ids[0] in errors and int(f.item_ids[0][1:]) >= 500)
    assert set(late.evidence["answers"]) == {"a", "b"}


def test_observations_follow_the_grader() -> None:
    items = [
        Item(id="n", question="1+1", answer="2"),
        Item(id="c", question="pick", answer="Paris", choices=["Lyon", "Paris", "Nice"]),
        Item(id="t", question="capital", answer="Paris"),
    ]
    runs: dict[str, dict[str, dict[str, Any]]] = {
        "m1": {
            "n": {"extracted": "2", "correct": True, "error": None},
            "c": {"extracted": "A", "correct": False, "error": None},
            "t": {"extracted": None, "correct": False, "error": None},
        },
        "m2": {
            "n": {"extracted": "3.0", "correct": False, "error": None},
            "c": {"extracted": "B", "correct": True, "error": None},
            "t": {"extracted": None, "correct": None, "error": "timeout"},
        },
    }
    by_id = {o.item_id: o for o in observations(items, runs, "auto")}
    assert by_id["n"].kind == "numeric" and by_id["n"].answers == {"m1": "2", "m2": "3"}
    assert by_id["c"].kind == CATEGORICAL and by_id["c"].options == 3 and by_id["c"].gold == "B"
    assert by_id["c"].answers == {"m1": "A", "m2": "B"}
    assert by_id["t"].kind == "exact" and by_id["t"].answers == {"m1": None}  # the failed item: no answer


def test_q_values_are_the_running_false_alarm_share_made_monotone() -> None:
    q = q_values({"a": 0.99, "b": 0.95, "c": 0.9, "d": 0.5, "e": 0.96})
    # ranked a .99, e .96, b .95, c .9, d .5: running means of (1 - score)
    assert q == pytest.approx({"a": 0.01, "e": 0.025, "b": 0.1 / 3, "c": 0.2 / 4, "d": 0.7 / 5})
    # a lower-scoring item can make a looser cut look better on average: never a tighter one
    q = q_values({"a": 0.8, "b": 0.99, "c": 0.99})
    assert q["b"] == q["c"] and q["a"] == pytest.approx(0.22 / 3)
    assert q_values({}) == {}


def test_audit_ranks_flags_by_score_with_evidence_and_threshold() -> None:
    p = planted_dataset()
    items = items_of(p.rows)
    runs = {m: grade_replay(items, lines) for m, lines in p.answers.items()}
    report = audit(items, runs)
    agreement = [f for f in report["flags"] if f["kind"] == AGREEMENT]
    flagged = {f["item_ids"][0] for f in agreement}
    recall, precision = recall_precision(flagged, p.errors)
    majority = {
        f["item_ids"][0] for f in audit(items, runs, method=MAJORITY)["flags"] if f["kind"] == AGREEMENT
    }
    # the default cut keeps the estimated false-alarm share at 0.1 at most
    assert report["max_fdr"] == 0.1 and report["reliability"]["estimated_fdr"] <= 0.1
    assert report["reliability"]["lowest_fdr"] <= report["reliability"]["estimated_fdr"]
    assert recall >= 0.97 and precision >= 0.85, (recall, precision)
    assert recall >= recall_precision(majority, p.errors)[0]
    scores = [f["score"] for f in report["flags"]]
    assert scores == sorted(scores, reverse=True) and max(f["evidence"]["q_value"] for f in agreement) <= 0.1
    top = agreement[0]["evidence"]
    assert set(top["answers"]) == set(runs) and set(top["accuracy"]) == set(runs)
    assert top["suggested_gold"] is not None and top["suggested_probability"] > 0.5
    learned = report["reliability"]["accuracy"]
    assert learned["model-a"] > learned["model-c"]
    # the suggested gold is the true sum where the models' answers say so
    truth = {r["id"]: eval(r["question"][8:-1]) for r in p.rows}  # "What is a + b?"
    offsets = [f for f in agreement if p.kinds.get(f["item_ids"][0]) == "offset"]
    right = sum(f["evidence"]["suggested_gold"] == str(truth[f["item_ids"][0]]) for f in offsets)
    assert right >= 0.9 * len(offsets)
    # a higher threshold flags a subset, every score in it at least the threshold
    strict = audit(items, runs, threshold=0.99)
    strict_flagged = {f["item_ids"][0] for f in strict["flags"] if f["kind"] == AGREEMENT}
    assert strict_flagged < flagged and all(
        report["reliability"]["scores"][i] >= 0.99 for i in strict_flagged
    )
