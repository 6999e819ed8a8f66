"""Paired statistics of two runs on the same items, and the comparison of two runs' results
(used by `evalctl compare` and `reproduce`, and, aggregated in SQL, by the aggregator's
compare page (items.compare_stats), so that all show the same figures in the same shape):

* the exact McNemar test on the discordant pairs (items right in one run only): under
  "no difference" each is equally likely to favour either run, so the two-sided p-value is
  a binomial tail, computed exactly with integers;
* a paired bootstrap confidence interval for the accuracy delta. Resampling n items with
  replacement draws multinomial counts over the distinct per-item differences, so the
  bootstrap runs on their histogram: the same distribution as resampling items one by one,
  in O(resamples x distinct differences) instead of O(resamples x items), and computable
  from a GROUP BY in PostgreSQL without reading every item.

Both tests are paired (the same items, answered twice), which is far more sensitive than
comparing two accuracies as if they were independent samples. A failed item counts as wrong
(score 0), as in the run's own accuracy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
EXACT_UP_TO = 2_000  # discordant pairs summed as exact integers; beyond, in log space


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts: items right only in run
    A, items right only in run B. 1.0 when there are none."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    m = min(a_only, b_only)
    if n <= EXACT_UP_TO:
        tail = sum(math.comb(n, k) for k in range(m + 1))
        return min(1.0, 2 * tail / 2**n)  # int / int: exact, correctly rounded
    # Beyond that the integers grow to thousands of digits (minutes for a 150k-item run):
    # sum the terms in log space instead; the last term (k = m <= n/2) is the largest.
    log_terms = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in range(m + 1)]
    top = log_terms[-1]
    log_tail = top + math.log(math.fsum(math.exp(t - top) for t in log_terms))
    return min(1.0, 2 * math.exp(log_tail - n * math.log(2)))


def bootstrap_ci_from_counts(
    diff_counts: Mapping[float, int],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval for the mean per-item difference (score in B minus
    score in A), from how many items have each difference; None without items."""
    values = sorted(v for v, k in diff_counts.items() if k > 0)
    counts = np.array([diff_counts[v] for v in values], dtype=np.int64)
    n = int(counts.sum()) if len(values) else 0
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n, counts / n, size=resamples)  # resamples x distinct values
    means = np.sort(draws @ np.array(values, dtype=np.float64) / n)
    alpha = (1 - confidence) / 2
    lo = float(means[max(0, math.floor(alpha * resamples))])
    hi = float(means[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)])
    return round(lo, 6), round(hi, 6)


def paired_bootstrap_ci(
    a_scores: Sequence[float],
    b_scores: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval for mean(b) - mean(a) over paired items; None without
    items. Resamples items (pairs), not runs: the pairing is what makes it tight."""
    if len(a_scores) != len(b_scores):
        raise ValueError("paired scores must have the same length")
    diffs = Counter(round(b - a, 9) for a, b in zip(a_scores, b_scores, strict=True))
    return bootstrap_ci_from_counts(diffs, resamples=resamples, confidence=confidence, seed=seed)


def _round(x: float | None) -> float | None:
    return round(x, 6) if x is not None else None


def figures(
    acc_a: float | None,
    acc_b: float | None,
    ci: tuple[float, float] | None,
    a_only: int,
    b_only: int,
    *,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """The "accuracy" and "mcnemar" sections of a comparison, from the accuracies on the
    common items, the bootstrap interval and the discordant counts."""
    return {
        "accuracy": {
            "a": _round(acc_a),
            "b": _round(acc_b),
            "delta": _round(acc_b - acc_a) if acc_a is not None and acc_b is not None else None,
            "ci": list(ci) if ci else None,
            "confidence": CONFIDENCE,
            "bootstrap": {"resamples": resamples, "seed": seed},
        },
        "mcnemar": {
            "right_in_a_only": a_only,
            "right_in_b_only": b_only,
            "p_value": round(mcnemar_exact(a_only, b_only), 6),
        },
    }


# --------------------------------------------------------------------------- two runs' results

Result = Mapping[str, Any]  # a row of item_results: item_id, response, extracted, correct, score, error
# what a comparison reads of each result (queries.results)
COMPARED_COLUMNS = (
    "item_id",
    "response",
    "extracted",
    "correct",
    "score",
    "error",
    "cache_hit",
    "served_by",
    "model_revision",
)


def _right(r: Result) -> bool:
    return r.get("error") is None and bool(r.get("correct"))


def _score(r: Result) -> float:
    return 0.0 if r.get("error") is not None else float(r.get("score") or 0.0)


def compare_results(
    a: Sequence[Result],
    b: Sequence[Result],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """Per-item differences and the paired statistics over the items both runs have."""
    by_a = {str(r["item_id"]): r for r in a}
    by_b = {str(r["item_id"]): r for r in b}
    common = sorted(by_a.keys() & by_b.keys())
    pairs = [(by_a[i], by_b[i]) for i in common]
    answer_changed = [
        i for i, (x, y) in zip(common, pairs, strict=True) if x.get("response") != y.get("response")
    ]
    extracted_changed = [
        i for i, (x, y) in zip(common, pairs, strict=True) if x.get("extracted") != y.get("extracted")
    ]
    a_only = [i for i, (x, y) in zip(common, pairs, strict=True) if _right(x) and not _right(y)]
    b_only = [i for i, (x, y) in zip(common, pairs, strict=True) if _right(y) and not _right(x)]
    score_changed = [i for i, (x, y) in zip(common, pairs, strict=True) if _score(x) != _score(y)]
    a_scores = [_score(x) for x, _ in pairs]
    b_scores = [_score(y) for _, y in pairs]
    acc_a = math.fsum(a_scores) / len(common) if common else None
    acc_b = math.fsum(b_scores) / len(common) if common else None
    ci = paired_bootstrap_ci(a_scores, b_scores, resamples=resamples, seed=seed)
    return {
        "items": {
            "a": len(by_a),
            "b": len(by_b),
            "common": len(common),
            "only_in_a": sorted(by_a.keys() - by_b.keys()),
            "only_in_b": sorted(by_b.keys() - by_a.keys()),
        },
        "identical_responses": len(common) - len(answer_changed),
        "answer_changed": answer_changed,
        "extracted_changed": extracted_changed,
        "score_changed": score_changed,
        "flips": {"right_in_a_only": a_only, "right_in_b_only": b_only},
        **figures(acc_a, acc_b, ci, len(a_only), len(b_only), resamples=resamples, seed=seed),
    }
