"""Two runs' results compared item by item (`evalctl compare`), and a reproduction against
the run it reproduces (`evalctl reproduce --wait`). The statistics: paired.py."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from evalstream.common.analysis import queries
from evalstream.common.analysis.paired import COMPARED_COLUMNS, compare_results
from evalstream.common.analysis.reports import served_revisions
from evalstream.common.manifest import manifest_differences


async def load_results(conn: asyncpg.Connection, run_id: str) -> list[dict[str, Any]]:
    """What a comparison reads of each of a run's results, in item order."""
    return [dict(r) for r in await queries.results(conn, run_id, COMPARED_COLUMNS)]


async def reproduction_report(conn: asyncpg.Connection, original: str, new: str) -> dict[str, Any]:
    """How far run `new` reproduces run `original`: identical answers, the accuracies, cache
    hits, manifests and the model revisions that served them, and the whole comparison."""
    runs = {r["run_id"]: r for r in await queries.runs(conn, [original, new])}
    results = [await load_results(conn, r) for r in (original, new)]
    c = compare_results(*results)
    revisions = [await served_revisions(conn, r) for r in (original, new)]
    manifests = [json.loads(runs[r]["manifest"]) for r in (original, new)]
    differences = (
        manifest_differences(*manifests)
        if all(m.get("manifest_version", 1) >= 2 for m in manifests)
        else ["manifest_version"]
    )
    common = c["items"]["common"]
    return {
        "original": original,
        "reproduction": new,
        "items": common,
        "identical_answers": c["identical_responses"],
        "all_identical": c["identical_responses"] == common == len(results[0]) == len(results[1]),
        "accuracy": {
            "original": c["accuracy"]["a"],
            "reproduction": c["accuracy"]["b"],
            "delta": c["accuracy"]["delta"],
        },
        "cache_hits": {
            "original": sum(r["cache_hit"] for r in results[0]),
            "reproduction": sum(r["cache_hit"] for r in results[1]),
        },
        "manifest_sha256": {
            "original": runs[original]["manifest_sha256"],
            "reproduction": runs[new]["manifest_sha256"],
            "identical": runs[original]["manifest_sha256"] == runs[new]["manifest_sha256"],
            "differences": differences,
        },
        "served_revisions": {
            "original": revisions[0],
            "reproduction": revisions[1],
            "identical": revisions[0] == revisions[1],
        },
        "comparison": c,
    }
