"""`evalctl compare`: the paired statistics against independent computations, and the
per-item differences."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Any

import pytest

from evalstream.common.analysis.paired import compare_results, mcnemar_exact, paired_bootstrap_ci


def brute_mcnemar(b: int, c: int) -> float:
    """Two-sided exact binomial test by enumeration: the probability, under p = 1/2, of an
    outcome at most as likely as the observed one."""
    n = b + c
    if n == 0:
        return 1.0
    p = [Fraction(math.comb(n, k), 2**n) for k in range(n + 1)]
    return float(min(Fraction(1), sum(q for q in p if q <= p[b])))


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 5), (5, 0), (1, 9), (3, 4), (10, 10), (2, 30), (17, 40)])
def test_mcnemar_matches_enumeration(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(brute_mcnemar(b, c), rel=1e-12)


def test_mcnemar_known_values() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 0.0625: 5 vs 0 is not yet significant
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(4, 6) == mcnemar_exact(6, 4) == 1.0 * mcnemar_exact(6, 4)
    # thousands of discordant pairs: exact integers, no overflow, no underflow to 0 where it matters
    assert 0.0 < mcnemar_exact(1450, 1550) < 0.1 < mcnemar_exact(1490, 1510) <= 1.0


def test_bootstrap_ci_is_deterministic_and_covers_the_observed_delta() -> None:
    rng = random.Random(1)
    a = [float(rng.random() < 0.6) for _ in range(400)]
    b = [float(rng.random() < 0.7) if x == 0 else float(rng.random() < 0.95) for x in a]
    ci = paired_bootstrap_ci(a, b)
    assert ci == paired_bootstrap_ci(a, b)  # fixed seed
    assert ci != paired_bootstrap_ci(a, b, seed=7)
    assert ci is not None
    delta = (sum(b) - sum(a)) / len(a)
    lo, hi = ci
    assert lo < delta < hi
    # close to the normal approximation of the paired difference
    d = [y - x for x, y in zip(a, b, strict=True)]
    sd = math.sqrt(sum((v - delta) ** 2 for v in d) / (len(d) - 1) / len(d))
    assert lo == pytest.approx(delta - 1.96 * sd, abs=0.015)
    assert hi == pytest.approx(delta + 1.96 * sd, abs=0.015)


def test_bootstrap_ci_degenerate_cases() -> None:
    same = [1.0, 0.0, 1.0, 1.0]
    assert paired_bootstrap_ci(same, same) == (0.0, 0.0)
    assert paired_bootstrap_ci([0.0] * 50, [1.0] * 50) == (1.0, 1.0)
    assert paired_bootstrap_ci([], []) is None
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1.0], [])


def row(item_id: str, response: str | None, correct: bool | None, error: str | None = None) -> dict[str, Any]:
    return {
        "item_id": item_id,
        "response": response,
        "extracted": response,
        "correct": correct,
        "score": float(bool(correct)),
        "error": error,
    }


def test_compare_results_lists_every_kind_of_difference() -> None:
    a = [
        row("1", "4", True),
        row("2", "5", False),
        row("3", "6", True),
        row("4", "x", True),
        row("5", None, None, error="timeout"),
        row("only-a", "1", True),
    ]
    b = [
        row("1", "4", True),  # identical
        row("2", "7", True),  # wrong -> right
        row("3", "9", False),  # right -> wrong
        row("4", "x ", True),  # response changed, still right
        row("5", "3", True),  # failed in A (counts as wrong) -> right
        row("only-b", "1", True),
    ]
    c = compare_results(a, b)
    assert c["items"] == {"a": 6, "b": 6, "common": 5, "only_in_a": ["only-a"], "only_in_b": ["only-b"]}
    assert c["identical_responses"] == 1
    assert c["answer_changed"] == ["2", "3", "4", "5"]
    assert c["flips"] == {"right_in_a_only": ["3"], "right_in_b_only": ["2", "5"]}
    assert c["score_changed"] == ["2", "3", "5"]
    assert c["accuracy"]["a"] == pytest.approx(3 / 5) and c["accuracy"]["b"] == pytest.approx(4 / 5)
    assert c["accuracy"]["delta"] == pytest.approx(1 / 5)
    assert c["mcnemar"] == {"right_in_a_only": 1, "right_in_b_only": 2, "p_value": 1.0}
    lo, hi = c["accuracy"]["ci"]
    assert lo < 0.2 < hi


def test_compare_of_a_run_with_itself_shows_no_difference() -> None:
    a = [row(str(i), str(i % 3), i % 2 == 0) for i in range(50)]
    c = compare_results(a, a)
    assert c["identical_responses"] == 50 and not c["answer_changed"] and not c["score_changed"]
    assert c["accuracy"]["delta"] == 0.0 and c["accuracy"]["ci"] == [0.0, 0.0]
    assert c["mcnemar"]["p_value"] == 1.0


def test_compare_without_common_items() -> None:
    c = compare_results([row("a", "1", True)], [row("b", "1", True)])
    assert c["items"]["common"] == 0 and c["accuracy"]["a"] is None and c["accuracy"]["ci"] is None
