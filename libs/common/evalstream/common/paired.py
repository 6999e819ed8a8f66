"""Paired statistics of two runs on the same items (used by `evalctl compare` and the
aggregator's compare page, so that both show the same figures):

* the exact McNemar test on the discordant pairs (items right in one run only): under
  "no difference" each is equally likely to favour either run, so the two-sided p-value is
  a binomial tail, computed exactly with integers;
* a paired bootstrap confidence interval for the accuracy delta. Resampling n items with
  replacement draws multinomial counts over the distinct per-item differences, so the
  bootstrap runs on their histogram: the same distribution as resampling items one by one,
  in O(resamples x distinct differences) instead of O(resamples x items), and computable
  from a GROUP BY in PostgreSQL without reading every item.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

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
