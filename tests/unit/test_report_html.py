"""The HTML run report (libs/common/evalstream/common/report_html.py), as pure functions:
the Wilson interval, what the page shows, that it is self-contained and escapes what it
quotes. tests/e2e/test_report.py renders a real run's page in headless Chromium."""

from __future__ import annotations

import re
from typing import Any

import pytest

from evalstream.common.analysis.report_html import LATENCY_EDGES_MS, ReportData, _nice_step, render, wilson


def summary(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "run_id": "run-1",
        "name": "unit",
        "status": "completed",
        "total": 40,
        "recorded": 40,
        "succeeded": 37,
        "failed": 3,
        "accuracy": 0.6,
        "accuracy_answered": 0.648649,
        "latency_ms": {"p50": 120.0, "p95": 700.0, "p99": 900.0},
        "items_per_s": 12.5,
        "duration_s": 3.2,
        "cache_hits": 10,
        "retried": 2,
        "truncated": 1,
        "tokens": {"prompt": 1000, "completion": 500},
        "model": "hf:smollm2-135m-instruct",
        "grader": "auto",
        "dataset_sha256": "d" * 64,
        "manifest_sha256": "m" * 64,
        "by_category": {
            "arithmetic": {"total": 20, "accuracy": 0.7, "failed": 1},
            "geography": {"total": 20, "accuracy": 0.5, "failed": 2},
        },
        "by_served_by": {"default/smollm2": {"total": 40, "accuracy": 0.6, "failed": 3}},
        "created_at": "2026-11-30T07:00:00+00:00",
        "completed_at": "2026-11-30T07:00:03+00:00",
    }
    s.update(over)
    return s


def data(**over: Any) -> ReportData:
    counts = [0] * (len(LATENCY_EDGES_MS) + 1)
    counts[5:9] = [3, 20, 10, 4]
    fields: dict[str, Any] = {
        "summary": summary(),
        "latency_counts": counts,
        "timeline_step_s": 0.5,
        "timeline": [(0.0, 3, 0), (0.5, 10, 1), (1.0, 12, 2), (1.5, 15, 0)],
        "failures": [
            {
                "item_id": "q7",
                "error": "no answer <script>alert(1)</script>",
                "attempts": 3,
                "served_by": "default/x",
                "category": "arithmetic",
            }
        ],
        "generated_at": "2026-11-30T07:00:04+00:00",
    }
    fields.update(over)
    return ReportData(**fields)


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (24, 40, 0.44596, 0.73652),  # p = 0.6
        (0, 10, 0.0, 0.27753),
        (10, 10, 0.72247, 1.0),
        (50, 100, 0.40383, 0.59617),
    ],
)
def test_wilson_interval_known_values(k: int, n: int, lo: float, hi: float) -> None:
    assert wilson(k, n) == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_is_symmetric_and_degenerates_sanely() -> None:
    lo, hi = wilson(7, 30)
    lo2, hi2 = wilson(23, 30)
    assert (lo, hi) == pytest.approx((1 - hi2, 1 - lo2))
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(3, 1000)[0] > 0 and wilson(3, 1000)[1] < 0.01


def test_page_shows_accuracy_with_interval_breakdowns_and_failures() -> None:
    page = render(data())
    assert "60.0%" in page and "95% CI 44.6% – 73.7% (Wilson, n=40)" in page
    assert "27.0%" in page  # cache hit rate: 10 of 37 answers
    assert page.count("<svg class='chart'") == 5
    category = re.search(r"id=\"by-category\">(.*?)</div>", page, re.S)
    assert category and category.group(1).count("class='bar'") == 2
    assert category.group(1).count("class='whisker'") == 2
    assert "showing 1 of 3 failures" in page
    assert "evalctl results run-1" in page


def test_page_is_self_contained_and_escapes_what_it_quotes() -> None:
    page = render(data(summary=summary(name="<b>x</b>", model='m"onload="bad')))
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    # nothing to fetch (the empty icon keeps browsers from asking for /favicon.ico)
    assert re.findall(r"(?:src|href)\s*=\s*[\"']([^\"']*)", page) == ["data:,"]
    assert "http://" not in page and "https://" not in page


def test_a_run_without_answers_still_renders() -> None:
    page = render(
        data(
            summary=summary(
                succeeded=0,
                failed=5,
                total=5,
                recorded=5,
                accuracy=0.0,
                accuracy_answered=None,
                cache_hits=0,
                latency_ms={"p50": None, "p95": None, "p99": None},
                items_per_s=None,
                by_category={},
                by_served_by={},
            ),
            latency_counts=[0] * (len(LATENCY_EDGES_MS) + 1),
            timeline=[],
            failures=[],
        )
    )
    assert page.count("class='frame'") == 5  # every chart says "no data" instead of breaking
    assert "n/a" in page


def test_timeline_buckets_are_round_numbers() -> None:
    assert [_nice_step(x) for x in (0.03, 0.5, 0.7, 3, 40, 120)] == [0.05, 0.5, 1.0, 5.0, 50.0, 200.0]


def test_lm_eval_scores_are_shown_with_their_interval() -> None:
    scores = {
        "grader": "loglikelihood",
        "scored": 369,
        "acc": {"value": 0.265583, "stderr": 0.023, "ci95": [0.220503, 0.310663], "n": 369},
        "acc_norm": {"value": 0.3, "stderr": 0.0239, "ci95": [0.25316, 0.34684], "n": 369},
    }
    page = render(data(summary=summary(grader="loglikelihood", scores=scores)))
    table = re.search(r"id='scores'>(.*?)</table>", page, re.S)
    assert table, "no scores table"
    assert "<td>acc</td><td>26.6% ± 2.3% (95% 22.1% – 31.1%), n 369</td>" in table.group(1)
    assert "<td>acc_norm</td><td>30.0% ± 2.4% (95% 25.3% – 34.7%), n 369</td>" in table.group(1)
    assert "id='scores'" not in render(data())  # a generated run has none


def test_score_rows_of_each_grader() -> None:
    from evalstream.common.analysis.reports import score_rows

    ppl = {
        "grader": "perplexity",
        "documents": 2,
        "word_perplexity": 125.97,
        "byte_perplexity": 2.94,
        "bits_per_byte": 1.556,
    }
    assert score_rows(ppl) == [
        ("documents", "2"),
        ("word_perplexity", "126"),
        ("byte_perplexity", "2.94"),
        ("bits_per_byte", "1.556"),
    ]
    em = {"value": 0.25, "stderr": None, "ci95": None, "n": 1}
    filters = {"grader": "lm_eval", "filters": [{"name": "strict-match", "exact_match": em}]}
    assert score_rows(filters) == [("exact_match,strict-match", "25.0%, n 1")]
    one = {"grader": "loglikelihood", "acc": em, "perplexity": 3.5}
    assert score_rows(one) == [("acc", "25.0%, n 1"), ("perplexity", "3.5")]
    assert score_rows(None) == []
