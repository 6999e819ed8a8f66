"""The gold-label audit: each check on small cases, then recall and precision on a dataset
with planted label errors answered by three simulated models (graded by the real graders).

`planted_dataset` is shared with tests/e2e/test_audit_replayed.py, which replays the same answers
through the pipeline."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from evalstream.common.analysis.audit import (
    AGREEMENT,
    DUPLICATE,
    MAJORITY,
    UNPARSABLE,
    audit,
    conflicting_duplicates,
    model_agreement,
    normalise,
    unparsable_golds,
)
from evalstream.common.messages import Item
from evalstream.worker.grading import get_grader

# ----------------------------------------------------------------------------- planted errors

MODEL_ACCURACY = {"model-a": 0.9, "model-b": 0.87, "model-c": 0.84}  # w.r.t. the TRUE labels


@dataclass
class Planted:
    rows: list[dict[str, Any]]  # dataset records (id, question, answer, category)
    answers: dict[str, list[dict[str, str]]]  # model -> replay lines {"id", "response"}
    errors: set[str]  # ids whose gold label is wrong
    kinds: dict[str, str] = field(default_factory=dict)  # id -> how it was planted


def planted_dataset(n: int = 500, error_rate: float = 0.08, seed: int = 9) -> Planted:
    """Sums a + b with unique operands. A fraction `error_rate` of the gold labels is wrong:
    most by a small offset, a few by a typo the numeric grader cannot read ("4O"), a few as a
    repeated question carrying another answer. Each model answers the TRUE sum with its own
    accuracy, otherwise a random nearby number (independent noise)."""
    rng = random.Random(seed)
    operands: set[tuple[int, int]] = set()
    while len(operands) < n:
        operands.add((rng.randint(10, 999), rng.randint(10, 999)))
    pairs = sorted(operands)
    rng.shuffle(pairs)
    truth = [a + b for a, b in pairs]
    questions = [f"What is {a} + {b}?" for a, b in pairs]
    gold = [str(t) for t in truth]
    planted = rng.sample(range(n), round(n * error_rate))
    kinds: dict[str, str] = {}
    clean = [i for i in range(n) if i not in set(planted)]
    for k, i in enumerate(planted):
        if k < 3:  # a typo: a digit typed as a letter
            gold[i] = gold[i][:-1] + {"0": "O", "1": "l"}.get(gold[i][-1], "O")
            kinds[f"p{i:04d}"] = "typo"
        elif k < 6:  # a repeated question with another answer
            j = clean[k]
            questions[i], pairs[i], truth[i] = questions[j], pairs[j], truth[j]
            gold[i] = str(truth[j] + rng.choice([-10, -2, 1, 3, 10]))
            kinds[f"p{i:04d}"] = "duplicate"
        else:
            gold[i] = str(truth[i] + rng.choice([o for o in range(-10, 11) if o]))
            kinds[f"p{i:04d}"] = "offset"
    rows = [
        {"id": f"p{i:04d}", "question": questions[i], "answer": gold[i], "category": "arithmetic"}
        for i in range(n)
    ]
    answers: dict[str, list[dict[str, str]]] = {}
    for model, accuracy in MODEL_ACCURACY.items():
        lines = []
        for i, (a, b) in enumerate(pairs):
            said = (
                truth[i]
                if rng.random() < accuracy
                else truth[i] + rng.choice([o for o in range(-30, 31) if o])
            )
            style = rng.randrange(3)
            text = (str(said), f"The answer is {said}.", f"{a} + {b} = {said}")[style]
            lines.append({"id": f"p{i:04d}", "response": text})
        answers[model] = lines
    return Planted(rows, answers, {f"p{i:04d}" for i in planted}, kinds)


def items_of(rows: list[dict[str, Any]]) -> list[Item]:
    return [
        Item(id=r["id"], question=r["question"], answer=r["answer"], category=r.get("category")) for r in rows
    ]


def grade_replay(items: list[Item], lines: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """What a run of the replayed answers records per item, graded by the real "auto" grader."""
    said = {line["id"]: line["response"] for line in lines}
    out = {}
    for item in items:
        grade = get_grader("auto", item)(said[item.id], item)
        out[item.id] = {"extracted": grade.extracted, "correct": grade.correct, "error": None}
    return out


def recall_precision(found: set[str], planted: set[str]) -> tuple[float, float]:
    hits = len(found & planted)
    return hits / len(planted), (hits / len(found) if found else 0.0)


# ----------------------------------------------------------------------------- checks


def right(extracted: str) -> dict[str, Any]:
    return {"extracted": extracted, "correct": True, "error": None}


def wrong(extracted: str) -> dict[str, Any]:
    return {"extracted": extracted, "correct": False, "error": None}


def test_normalise_ignores_case_spacing_end_punctuation_and_number_spelling() -> None:
    assert normalise("  What is  2+2? ") == normalise("what is 2+2") == "what is 2+2"
    assert normalise("4.0") == normalise("4") == "4"
    assert normalise("1,234") == "1234"
    assert normalise("Paris.") == "paris" != normalise("Lyon")


@pytest.mark.parametrize(
    "text",
    ["1,000", "-5", "+3.5", ".5", "Inf", "NaN", "-infinity", "1_000", "١٢", "１２", " 7 ", "e5", "1e5",
     "(3)", "_1", "İnf", "What is 1+2?", "", "...",
     # plain digits take a shortcut (int, no float): it must agree where float rounds
     "0", "007", "42", "999999999999999", "9999999999999999", "12345678901234567", "²", "٣"],
)  # fmt: skip
def test_normalise_reads_numbers_as_float_does(text: str) -> None:
    """normalise skips float() for text that cannot start a number, and reads plain ASCII
    digits with int(): it must give what float() gives on every spelling it accepts
    (Unicode digits, inf, nan, underscores, leading zeros, 16 digits and more)."""
    from evalstream.common.analysis.questions import _END_PUNCTUATION

    stripped = " ".join(text.casefold().split()).strip(_END_PUNCTUATION)
    try:
        value = float(stripped.replace(",", ""))
    except ValueError:
        assert normalise(text) == stripped
        return
    expected = str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    assert normalise(text) == expected


def test_duplicate_questions_with_different_golds_are_flagged() -> None:
    items = [
        Item(id="a", question="What is 2 + 2?", answer="4"),
        Item(id="b", question="what is 2 + 2", answer="5"),
        Item(id="c", question="What is 3 + 3?", answer="6"),
        Item(id="d", question="What is 3 + 3 ?", answer="6.0"),  # the same answer, spelt differently
        Item(id="e", question="Pick one", answer="A", choices=["x", "y"]),
        Item(id="f", question="Pick one", answer="B", choices=["y", "x"]),  # other choices: not the same
    ]
    flags = conflicting_duplicates(items)
    assert [(f.kind, f.item_ids, f.suspects) for f in flags] == [(DUPLICATE, ["a", "b"], ["a", "b"])]
    assert flags[0].evidence["answers"] == {"a": "4", "b": "5"}
    # with runs, the item whose gold the models contradict is the suspect
    runs = {"m1": {"a": right("4"), "b": wrong("4")}, "m2": {"a": right("4"), "b": wrong("4")}}
    (flag,) = conflicting_duplicates(items, runs)
    assert flag.suspects == ["b"] and flag.evidence["models_agree_with_gold"] == {"a": True, "b": False}


def test_model_agreement_needs_a_strict_majority_of_different_models() -> None:
    items = [Item(id=x, question=f"q{x}", answer="10") for x in "abcde"]
    runs = {
        "m1": {"a": wrong("12"), "b": wrong("12"), "c": wrong("12"), "d": right("10"), "e": wrong("11")},
        "m2": {"a": wrong("12"), "b": wrong("12"), "c": right("10"), "d": right("10"), "e": wrong("13")},
        "m3": {"a": wrong("12"), "b": right("10"), "c": right("10"), "d": wrong("12")},  # no answer for e
    }
    flags = model_agreement(items, runs)
    assert [f.item_ids for f in flags] == [["a"], ["b"]]
    assert flags[0].evidence["votes"] == 3 and flags[0].evidence["agreed_answer"] == "12"
    assert flags[1].evidence["models"] == ["m1", "m2"] and flags[1].evidence["others"] == {"m3": "10"}
    # one model is no evidence, and --min-agree 3 drops the 2-of-3 item
    assert model_agreement(items, {"m1": runs["m1"]}) == []
    assert [f.item_ids for f in model_agreement(items, runs, min_agree=3)] == [["a"]]


def test_a_tie_between_the_gold_and_another_answer_is_no_flag() -> None:
    items = [Item(id="tie", question="q1", answer="10"), Item(id="most", question="q2", answer="10")]
    runs = {
        "m1": {"tie": wrong("12"), "most": wrong("12")},
        "m2": {"tie": wrong("12"), "most": wrong("12")},
        "m3": {"tie": right("10"), "most": wrong("12")},
        "m4": {"tie": right("10"), "most": right("10")},
    }
    assert [f.item_ids for f in model_agreement(items, runs)] == [["most"]]


def test_failed_items_and_unreadable_answers_do_not_vote() -> None:
    items = [Item(id="a", question="q", answer="1")]
    runs = {
        "m1": {"a": wrong("2")},
        "m2": {"a": {"extracted": None, "correct": False, "error": None}},
        "m3": {"a": {"extracted": "2", "correct": None, "error": "boom"}},
    }
    # m1 alone disagrees: 1 vote of the 1 model that answered is below min_agree 2
    assert model_agreement(items, runs) == []


def test_unparsable_gold_with_a_numeric_grader_and_with_auto() -> None:
    items = [
        Item(id="n1", question="1+1?", answer="2", category="math"),
        Item(id="n2", question="2+2?", answer="4O", category="math"),  # a typo: auto would grade it as text
        Item(id="n3", question="3+3?", answer="6", category="math"),
        Item(id="n4", question="4+4?", answer="8", category="math"),
        Item(id="n5", question="5+5?", answer="10", category="math"),
        Item(id="t1", question="Capital of France?", answer="Paris", category="geo"),
        Item(id="mc", question="Pick", answer="D", choices=["x", "y"], category="mc"),
    ]
    by_numeric = unparsable_golds(items[:5], "numeric")
    assert [(f.kind, f.item_ids) for f in by_numeric] == [(UNPARSABLE, ["n2"])]
    by_auto = unparsable_golds(items, "auto")
    assert [f.item_ids[0] for f in by_auto] == ["n2", "mc"]
    assert by_auto[0].evidence["numeric_golds_in_category"] == "4/5"
    # below the share a category is not called numeric: 4 numbers of 6 golds
    mixed = [*items[:5], Item(id="n6", question="6+6?", answer="twelve", category="math")]
    assert unparsable_golds(mixed, "auto") == []
    assert "none of the 2 choices" in by_auto[1].message
    # a text category stays text
    assert (
        unparsable_golds([items[4], Item(id="t2", question="?", answer="Rome", category="geo")], "auto") == []
    )


def test_audit_report_lists_every_flag_and_what_was_skipped() -> None:
    items = [Item(id="a", question="q", answer="1"), Item(id="b", question="Q.", answer="2")]
    report = audit(items, {})
    assert report["counts"] == {DUPLICATE: 1} and report["suspects"] == ["a", "b"]
    assert AGREEMENT in report["skipped"] and UNPARSABLE not in report["skipped"]
    assert report["flags"][0]["evidence"]["answers"] == {"a": "1", "b": "2"}


# ----------------------------------------------------------------------------- planted errors


def test_planted_dataset_is_what_it_claims() -> None:
    p = planted_dataset()
    assert len(p.rows) == 500 and len(p.errors) == 40
    assert sorted(p.kinds.values()).count("typo") == 3 and sorted(p.kinds.values()).count("duplicate") == 3
    assert planted_dataset().rows == p.rows  # a fixed seed: the same data everywhere
    for model, accuracy in MODEL_ACCURACY.items():
        graded = grade_replay(items_of(p.rows), p.answers[model])
        # on the clean items the grades measure the model's accuracy
        clean = [graded[r["id"]]["correct"] for r in p.rows if r["id"] not in p.errors]
        assert abs(sum(clean) / len(clean) - accuracy) < 0.05


def test_audit_finds_planted_label_errors() -> None:
    p = planted_dataset()
    items = items_of(p.rows)
    runs = {model: grade_replay(items, lines) for model, lines in p.answers.items()}
    report = audit(items, runs)
    recall, precision = recall_precision(set(report["suspects"]), p.errors)
    assert recall >= 0.9, (recall, sorted(p.errors - set(report["suspects"])))
    assert precision >= 0.8, (precision, sorted(set(report["suspects"]) - p.errors))
    # every kind of planted error is found by the check meant for it
    found = {f["item_ids"][0] if f["kind"] != DUPLICATE else tuple(f["suspects"]) for f in report["flags"]}
    for item_id, kind in p.kinds.items():
        if kind == "typo":
            assert any(f["kind"] == UNPARSABLE and item_id in f["item_ids"] for f in report["flags"])
        if kind == "duplicate":
            assert (item_id,) in found
    # without the models only the checks that need none remain, and they miss the offsets
    alone = audit(items, {})
    assert recall_precision(set(alone["suspects"]), p.errors)[0] < 0.3


@pytest.mark.parametrize("models", [["model-a", "model-b"], ["model-a", "model-b", "model-c"]])
def test_more_models_do_not_lower_the_majority_votes_precision(models: list[str]) -> None:
    p = planted_dataset()
    items = items_of(p.rows)
    runs = {m: grade_replay(items, p.answers[m]) for m in models}
    flagged = {
        f["item_ids"][0] for f in audit(items, runs, method=MAJORITY)["flags"] if f["kind"] == AGREEMENT
    }
    assert recall_precision(flagged, p.errors)[1] >= 0.9
