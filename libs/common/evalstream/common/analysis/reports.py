"""Run summaries, computed in PostgreSQL from the one row per item.

accuracy = mean score over *all* items, a failed item scoring 0, so that failures can
never flatter a model; `accuracy_answered` gives the mean over the items that got an
answer. Both are recomputable from `evalctl results`.

A run graded by log-likelihood scoring (evalstream.common.scoring) also gets lm-eval's
metrics under `scores`, over its scored items (failed ones are in `failed`): for the
`loglikelihood` grader acc and, for items of two choices or more, acc_norm, each with
lm-eval's standard error and a normal 95 % interval, and for one-continuation items
perplexity = exp(-mean log-likelihood); for the `perplexity` grader word_perplexity,
byte_perplexity and bits_per_byte (lm-eval's weighted aggregations over words and bytes).
A perplexity run has no accuracy (None): nothing in it is right or wrong.

A run graded by `lm_eval` (an lm-eval generate_until task) gets lm-eval's exact_match of
each filter pipeline under `scores.filters`, in the task's order (gsm8k: strict-match, whose
grade is the run's accuracy, then flexible-extract), each with its standard error and 95 % interval, read from
the pipelines' answers each result keeps in `detail`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from evalstream.common import scoring
from evalstream.common.analysis import queries
from evalstream.common.lmeval_filters import filter_counts


async def served_revisions(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> dict[str, dict[str, int]]:
    """served_by -> {engine revision ("unknown" from workers that predate reporting it): items}."""
    out: dict[str, dict[str, int]] = {}
    for r in await conn.fetch(queries.REVISIONS, run_id):
        out.setdefault(r["served_by"], {})[r["model_revision"] or "unknown"] = r["n"]
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 6) if b else None


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


LM_EVAL = "lm_eval"


async def scores_summary(
    conn: asyncpg.Connection | asyncpg.Pool, run_id: str, grader: str
) -> dict[str, Any] | None:
    """lm-eval's metrics of a log-likelihood or lm_eval run (the module's docstring), None for
    a run of another grader."""
    name = grader.partition(":")[0]
    if name == LM_EVAL:
        rows = await conn.fetch(queries.DETAILS, run_id)
        return filter_scores(filter_counts(r["detail"] for r in rows))
    if name not in scoring.SCORING_GRADERS:
        return None
    r = await conn.fetchrow(queries.SCORE_SUMS, run_id)
    assert r is not None
    return scores_from_sums(name, dict(r))


def scores_from_sums(grader: str, r: dict[str, Any]) -> dict[str, Any]:
    """The `scores` section from the per-run sums of queries.SCORE_SUMS (pure: unit-tested)."""
    if grader == scoring.PERPLEXITY:
        return {
            "grader": grader,
            "documents": r["docs"],
            "words": r["words"],
            "bytes": r["bytes"],
            "loglikelihood": r["doc_ll_sum"],
            **scoring.rolling_metrics(r["doc_ll_sum"], r["words"], r["bytes"]),
        }
    out: dict[str, Any] = {"grader": grader, "scored": r["scored"]}
    if r["mc_n"]:
        out["acc"] = scoring.mean_with_interval(r["mc_acc_sum"], r["mc_n"])
        out["acc_norm"] = scoring.mean_with_interval(r["mc_norm_sum"], r["mc_n"])
    if r["one_n"]:
        # one continuation per item (lm-eval's loglikelihood output type): acc = greedy
        out["acc_greedy" if r["mc_n"] else "acc"] = scoring.mean_with_interval(r["one_acc_sum"], r["one_n"])
        out["perplexity"] = scoring.perplexity_of_mean(r["one_ll_sum"], r["one_n"])
    return out


def score_rows(scores: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The `scores` section as (metric, value) rows for people (the CLI's report, the HTML
    report): a mean with its standard error and 95 % interval, a perplexity as a number."""

    def mean(m: dict[str, Any] | None) -> str:
        if not m or m.get("value") is None:
            return "n/a"
        text = f"{m['value']:.1%}"
        if m.get("stderr") is not None:
            text += f" ± {m['stderr']:.1%}"
        if m.get("ci95"):
            text += f" (95% {m['ci95'][0]:.1%} – {m['ci95'][1]:.1%})"
        return text + f", n {m.get('n', 0)}"

    def number(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    if not scores:
        return []
    if scores.get("grader") == scoring.PERPLEXITY:
        return [
            ("documents", str(scores.get("documents", 0))),
            *((k, number(scores.get(k))) for k in ("word_perplexity", "byte_perplexity", "bits_per_byte")),
        ]
    if scores.get("grader") == LM_EVAL:
        return [(f"exact_match,{f['name']}", mean(f["exact_match"])) for f in scores.get("filters", [])]
    rows: list[tuple[str, str]] = [
        (k, mean(scores[k])) for k in ("acc", "acc_norm", "acc_greedy") if k in scores
    ]
    if "perplexity" in scores:
        rows.append(("perplexity", number(scores["perplexity"])))
    return rows


def filter_scores(counts: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The `scores` section of an lm_eval run from its per-pipeline counts (right, graded):
    exact_match of each filter, as lm-eval reports `exact_match,strict-match` and the like."""
    return {
        "grader": LM_EVAL,
        "scored": max((n for _, n in counts.values()), default=0),
        # a list: the first pipeline's is the run's accuracy, and JSON readers may sort keys
        "filters": [
            {"name": name, "exact_match": scoring.mean_with_interval(right, n)}
            for name, (right, n) in counts.items()
        ],
    }


async def summarise(conn: asyncpg.Connection | asyncpg.Pool, run_id: str) -> dict[str, Any]:
    run = await queries.run(conn, run_id)
    if run is None:
        raise KeyError(run_id)
    t = await conn.fetchrow(queries.TOTALS, run_id)
    assert t is not None
    breakdown = {}
    for col in ("category", "served_by"):
        rows = await conn.fetch(queries.BREAKDOWN.format(col=col), run_id)
        breakdown[col] = {
            r["key"]: {"total": r["n"], "accuracy": _ratio(r["score_sum"], r["n"]), "failed": r["failed"]}
            for r in rows
        }
    total = run["total"] or 0
    scores = await scores_summary(conn, run_id, run["grader"] or "")
    perplexity_run = scores is not None and scores["grader"] == scoring.PERPLEXITY
    started = run["published_at"] or run["created_at"]
    elapsed = (t["last_recorded"] - started).total_seconds() if t["last_recorded"] and started else 0.0
    return {
        "run_id": run_id,
        "name": run["name"],
        "status": run["status"],
        "total": total,
        "recorded": t["n"],
        "succeeded": t["succeeded"],
        "failed": t["failed"],
        "accuracy": None if perplexity_run else _ratio(t["score_sum"], total),
        "accuracy_answered": None if perplexity_run else _ratio(t["answered_score_sum"], t["succeeded"]),
        "latency_ms": {"p50": t["p50"], "p95": t["p95"], "p99": t["p99"]},
        "items_per_s": round(t["n"] / elapsed, 3) if elapsed > 0 else None,
        "duration_s": round(elapsed, 3),
        "cache_hits": t["cache_hits"],
        "retried": t["retried"],
        "truncated": t["truncated"],
        "tokens": {"prompt": t["prompt_tokens"], "completion": t["completion_tokens"]},
        "model": run["model"],
        "grader": run["grader"],
        "dataset_sha256": run["dataset_sha256"],
        "manifest_sha256": run["manifest_sha256"],
        "by_category": breakdown["category"],
        "by_served_by": breakdown["served_by"],
        "served_revisions": await served_revisions(conn, run_id),
        **({"scores": scores} if scores is not None else {}),
        "created_at": _iso(run["created_at"]),
        "completed_at": _iso(run["completed_at"]),
    }
