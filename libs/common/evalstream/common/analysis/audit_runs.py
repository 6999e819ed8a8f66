"""The label audit of a dataset version with the runs on it: what `evalctl audit` and
`evalctl report --exclude-flagged` read (the dataset, each model's newest run, its results)
before the checks of audit.py run on them."""

from __future__ import annotations

from typing import Any

import asyncpg

from evalstream.common.analysis import queries
from evalstream.common.analysis.audit import MAX_FDR, MIN_AGREE, RELIABILITY, RunResults, audit
from evalstream.common.analysis.versions import load_ref
from evalstream.common.settings import Settings

_RUN_COLUMNS = "run_id, model, grader, status, dataset_sha256, created_at"
AUDITED_COLUMNS = ("item_id", "extracted", "correct", "error")  # of each result


async def runs_by_model(
    conn: asyncpg.Connection, content_sha256: str, run_ids: list[str] | None
) -> tuple[dict[str, RunResults], dict[str, str], list[str]]:
    """(model -> results, model -> run id, graders used): the given runs, or every completed
    run on this dataset version; the newest run of each model."""
    if run_ids:
        rows = await queries.runs(conn, run_ids, _RUN_COLUMNS)
        missing = set(run_ids) - {r["run_id"] for r in rows}
        if missing:
            raise LookupError(f"no run(s) {', '.join(sorted(missing))}")
        other = [r["run_id"] for r in rows if r["dataset_sha256"] != content_sha256]
        if other:
            raise LookupError(
                f"run(s) {', '.join(other)} were not on this dataset version ({content_sha256[:12]})"
            )
    else:
        rows = await queries.completed_runs(conn, content_sha256, _RUN_COLUMNS)
    newest: dict[str, asyncpg.Record] = {}
    for r in sorted(rows, key=lambda r: r["created_at"]):
        newest[r["model"]] = r
    results: dict[str, RunResults] = {}
    for model, r in newest.items():
        fetched = await queries.results(conn, r["run_id"], AUDITED_COLUMNS)
        results[model] = {f["item_id"]: dict(f) for f in fetched}
    return results, {m: r["run_id"] for m, r in newest.items()}, sorted({r["grader"] for r in rows})


async def audit_version(
    conn: asyncpg.Connection,
    settings: Settings,
    dataset_ref: str,
    run_ids: list[str] | None,
    *,
    grader: str | None = None,
    method: str = RELIABILITY,
    threshold: float | None = None,
    max_fdr: float = MAX_FDR,
    min_agree: int = MIN_AGREE,
) -> tuple[dict[str, Any], str]:
    """(the audit report of a dataset version with its runs, the dataset's label). Raises
    DatasetRefError or LookupError for a dataset or run that is not there."""

    dataset = await load_ref(conn, settings, dataset_ref)
    runs, run_of, graders = await runs_by_model(conn, dataset.content_sha256, run_ids)
    grader = grader or (graders[0] if len(graders) == 1 else "auto")
    report = audit(
        dataset.items,
        runs,
        grader=grader,
        min_agree=min_agree,
        method=method,
        threshold=threshold,
        max_fdr=max_fdr,
    )
    label = f"{dataset.label} [{dataset.content_sha256[:12]}]"
    return {"dataset": dataset.content_sha256, "runs": run_of, **report}, label


async def accuracy_without_flagged(
    conn: asyncpg.Connection,
    settings: Settings,
    run_id: str,
    *,
    threshold: float | None = None,
    max_fdr: float = MAX_FDR,
) -> dict[str, Any]:
    """For `evalctl report --exclude-flagged`: the run's accuracy over the items the audit of
    its dataset version (every completed run on it, this one included) does not flag, beside
    the raw figure; a failed item scores 0 in both, as in the report."""
    run = await queries.run(conn, run_id, "dataset_sha256, total")
    if run is None:
        raise LookupError(f"no run {run_id}")
    rows = await queries.results(conn, run_id, ("item_id", "score"))
    completed = await queries.completed_runs(conn, run["dataset_sha256"])
    run_ids = sorted({r["run_id"] for r in completed} | {run_id})
    report, _ = await audit_version(
        conn, settings, run["dataset_sha256"], run_ids, threshold=threshold, max_fdr=max_fdr
    )
    total = run["total"] or len(rows)
    flagged = set(report["suspects"])
    score = {r["item_id"]: float(r["score"] or 0.0) for r in rows}
    kept = total - len(flagged)
    return {
        "threshold": threshold,
        "max_fdr": report["max_fdr"],
        "models": report["models"],
        "flagged": len(flagged),
        "skipped": report["skipped"],
        "accuracy": round(sum(score.values()) / total, 6) if total else None,
        "accuracy_excluding_flagged": (
            round(sum(v for i, v in score.items() if i not in flagged) / kept, 6) if kept > 0 else None
        ),
    }
