"""The label audit's generated sets (bench/label_audit.py): items a third numeric, a third
multiple choice, a third short free text; some golds planted wrong; each model's responses
rendered in one of several styles and graded by the worker's real graders, as a run would
record them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from evalstream.common.messages import Item
from evalstream.worker.grading import get_grader

NUMERIC_SLIPS = (1, -1, 10, -10, 2, -2, 9, 11, 100, -100)
UNREADABLE_SHARE = 0.02


def _zipf_pick(rng: random.Random, options: Sequence[str]) -> str:
    return rng.choices(options, weights=[1 / (r + 1) for r in range(len(options))])[0]


def generate(
    n: int, error_rate: float, accuracies: Sequence[float], seed: int, graded: bool = True
) -> tuple[list[Item], dict[str, dict[str, dict[str, Any]]], set[str]]:
    """(items, model -> what a run records per item, the ids of the planted errors).
    graded=False skips rendering each response in a style and grading it (the oracle's large
    sets): the recorded answer is the one the model meant."""
    rng = random.Random(seed)
    items: list[Item] = []
    truths: list[str] = []
    plausible: list[list[str]] = []
    planted: set[str] = set()
    for i in range(n):
        item_id = f"q{i:05d}"
        style = i % 3
        if style == 0:
            a, b = rng.randint(100, 4999), rng.randint(100, 4999)
            truth = str(a + b)
            wrong = [str(a + b + d) for d in rng.sample(NUMERIC_SLIPS, 6)]
            question, choices = f"What is {a} + {b}?", None
        elif style == 1:
            truth = rng.choice("ABCD")
            wrong = [x for x in "ABCD" if x != truth]
            rng.shuffle(wrong)
            question, choices = f"Question {i}: which one?", [f"option {i}-{k}" for k in range(4)]
        else:
            truth = f"word{i}"
            wrong = [f"word{i}{suffix}" for suffix in rng.sample(["s", "ed", "ing", "er", "ly", "x"], 5)]
            question, choices = f"Name the thing number {i}.", None
        gold = truth
        if rng.random() < error_rate:
            gold = rng.choice(wrong)
            planted.add(item_id)
        items.append(Item(id=item_id, question=question, answer=gold, choices=choices))
        truths.append(truth)
        plausible.append(wrong)

    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for j, accuracy in enumerate(accuracies):
        model = f"model-{j + 1}"
        recorded: dict[str, dict[str, Any]] = {}
        for item, truth, wrong in zip(items, truths, plausible, strict=True):
            said = truth if rng.random() < accuracy else _wrong_answer(rng, item, wrong)
            if graded:
                grade = get_grader("auto", item)(_render(rng, item, said), item)
                recorded[item.id] = {"extracted": grade.extracted, "correct": grade.correct, "error": None}
            else:  # what the graders extract from every style, without rendering and parsing it
                recorded[item.id] = {"extracted": said, "correct": said == item.answer, "error": None}
        runs[model] = recorded
    return items, runs, planted


def _wrong_answer(rng: random.Random, item: Item, wrong: list[str]) -> str | None:
    if rng.random() < UNREADABLE_SHARE:
        return None
    if item.choices:  # an attractive distractor half the time
        return wrong[0] if rng.random() < 0.5 else rng.choice(wrong[1:])
    if rng.random() < 0.7:
        return _zipf_pick(rng, wrong)
    if item.question and item.question.startswith("What is"):
        return str(int(wrong[0]) + rng.randint(-900, 900) * 7 + 3)
    return f"guess{rng.randrange(10**9)}"


def _render(rng: random.Random, item: Item, said: str | None) -> str:
    if said is None:
        return rng.choice(["I am not sure.", "", "It depends on the context"])
    if item.choices:
        text = item.choices[ord(said) - ord("A")]
        return rng.choice([said, f"The answer is {said}.", f"({said}) {text}", f"{said}) {text}"])
    if item.question and item.question.startswith("What is"):
        return rng.choice(
            [said, f"The answer is {said}.", f"Adding them up.\n#### {said}", f"\\boxed{{{said}}}"]
        )
    return rng.choice([said, f"The answer is {said}.", f"**{said}**"])
