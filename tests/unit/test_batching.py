"""Dynamic batching plans."""

from __future__ import annotations

import random

import pytest

from evalstream.worker.batching import padding_ratio, plan_batches


def cost(lengths: list[int], batch: list[int], new: int) -> int:
    return (max(lengths[i] for i in batch) + new) * len(batch)


def test_sorts_by_length_and_respects_the_budget() -> None:
    lengths = [50, 10, 40, 20, 30]
    batches = plan_batches(lengths, token_budget=200, max_items=10, max_new_tokens=10)
    # (40+10)*4 = 200 fits exactly; adding the 50-token prompt would cost (50+10)*5 = 300
    assert batches == [[1, 3, 4, 2], [0]]
    assert all(cost(lengths, b, 10) <= 200 for b in batches)


def test_budget_boundary_is_inclusive() -> None:
    assert plan_batches([10, 10], token_budget=40, max_items=8, max_new_tokens=10) == [[0, 1]]
    assert plan_batches([10, 10], token_budget=39, max_items=8, max_new_tokens=10) == [[0], [1]]


def test_max_items_caps_batches() -> None:
    batches = plan_batches([5] * 10, token_budget=10_000, max_items=4)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_an_oversized_request_gets_a_batch_of_its_own() -> None:
    batches = plan_batches([5, 5000, 6], token_budget=100, max_items=8, max_new_tokens=16)
    assert batches == [[0, 2], [1]]


def test_per_request_max_new_tokens() -> None:
    # the short prompt wants many tokens: it cannot share a batch with the others
    batches = plan_batches([10, 10, 10], token_budget=100, max_items=8, max_new_tokens=[10, 10, 80])
    assert batches == [[0, 1], [2]]
    with pytest.raises(ValueError):
        plan_batches([1, 2], token_budget=10, max_items=2, max_new_tokens=[1])


def test_every_index_once_and_invariants_on_random_inputs() -> None:
    rng = random.Random(1)
    for _ in range(200):
        lengths = [rng.randint(0, 600) for _ in range(rng.randint(0, 80))]
        budget, items, new = rng.randint(1, 5000), rng.randint(1, 16), rng.randint(0, 64)
        batches = plan_batches(lengths, token_budget=budget, max_items=items, max_new_tokens=new)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for b in batches:
            assert 1 <= len(b) <= items
            assert len(b) == 1 or cost(lengths, b, new) <= budget
        flat = [lengths[i] for b in batches for i in b]
        assert flat == sorted(flat)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        plan_batches([1], token_budget=0, max_items=1)
    with pytest.raises(ValueError):
        plan_batches([1], token_budget=1, max_items=0)
    with pytest.raises(ValueError):
        plan_batches([-1], token_budget=1, max_items=1)
    assert plan_batches([], token_budget=1, max_items=1) == []


def test_padding_ratio() -> None:
    assert padding_ratio([]) == 0.0
    assert padding_ratio([0, 0]) == 0.0
    assert padding_ratio([7, 7, 7]) == 0.0
    assert padding_ratio([10, 30]) == pytest.approx(1 - 40 / 60)


def test_sorting_reduces_padding() -> None:
    rng = random.Random(2)
    lengths = [rng.randint(5, 500) for _ in range(256)]
    planned = plan_batches(lengths, token_budget=10**9, max_items=16)
    arrival = [list(range(i, i + 16)) for i in range(0, 256, 16)]

    def mean_padding(batches: list[list[int]]) -> float:
        return sum(padding_ratio([lengths[i] for i in b]) for b in batches) / len(batches)

    assert mean_padding(planned) < mean_padding(arrival) / 4
