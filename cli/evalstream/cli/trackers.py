"""A finished run in an experiment tracker (W&B, MLflow): what `evalctl export` sends and
`evalctl submit --wait --export` sends on completion (the command's help says what goes
over, and where). The trackers' packages (wandb, mlflow-skinny) are imported only here, when
asked for."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from evalstream.common.analysis import queries
from evalstream.common.analysis.reports import summarise
from evalstream.common.results import RESULT_COLUMNS as STORED_COLUMNS
from evalstream.common.settings import ExportSettings, Settings

TRACKERS = ("wandb", "mlflow")
# The tracker's results table: every stored column of an item but the run's own ids and the
# long texts kept for the item browser (question, gold, prompt, detail, evidence).
RESULT_COLUMNS = tuple(
    c
    for c in STORED_COLUMNS
    if c not in {"run_id", "shard_id", "question", "gold", "prompt", "detail", "evidence"}
)
MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value; the full manifest is an artifact


@dataclass(frozen=True)
class RunExport:
    run_id: str
    summary: dict[str, Any]
    manifest: dict[str, Any]
    rows: list[dict[str, Any]]

    def tags(self) -> dict[str, str]:
        s = self.summary
        return {
            "evalstream.run_id": self.run_id,
            "evalstream.model": str(s.get("model") or ""),
            "evalstream.grader": str(s.get("grader") or ""),
            "evalstream.dataset_sha256": str(s.get("dataset_sha256") or ""),
            "evalstream.manifest_sha256": str(s.get("manifest_sha256") or ""),
            "evalstream.status": str(s.get("status") or ""),
        }


_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def metric_key(*parts: str) -> str:
    """A key both trackers accept (MLflow allows letters, digits, `_-. /`)."""
    return "/".join(_KEY_UNSAFE.sub("_", p)[:200] or "_" for p in parts)


def metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The numbers of a run summary, flat; None (no latency for an all-failed run) left out."""
    out: dict[str, Any] = {
        k: summary.get(k)
        for k in (
            "accuracy",
            "accuracy_answered",
            "total",
            "succeeded",
            "failed",
            "cache_hits",
            "retried",
            "truncated",
            "items_per_s",
            "duration_s",
        )
    }
    for p in ("p50", "p95", "p99"):
        out[metric_key("latency_ms", p)] = (summary.get("latency_ms") or {}).get(p)
    for kind, n in (summary.get("tokens") or {}).items():
        out[metric_key("tokens", kind)] = n
    scores = summary.get("scores") or {}
    for name, value in scores.items():  # lm-eval's metrics: acc, acc_norm, perplexities
        if isinstance(value, dict) and "value" in value:
            out[metric_key("scores", name)] = value["value"]
            out[metric_key("scores", name, "stderr")] = value.get("stderr")
        elif name not in ("grader", "filters"):
            out[metric_key("scores", name)] = value
    for f in scores.get("filters") or []:
        out[metric_key("scores", "exact_match", str(f["name"]))] = f["exact_match"]["value"]
        out[metric_key("scores", "exact_match", str(f["name"]), "stderr")] = f["exact_match"]["stderr"]
    for category, c in (summary.get("by_category") or {}).items():
        out[metric_key("category", str(category), "accuracy")] = c.get("accuracy")
        out[metric_key("category", str(category), "total")] = c.get("total")
        out[metric_key("category", str(category), "failed")] = c.get("failed")
    return {k: float(v) for k, v in out.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"generation": {"max_tokens": 8}} -> {"generation.max_tokens": 8}; lists stay whole."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def results_jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps({c: r.get(c) for c in RESULT_COLUMNS}, ensure_ascii=False) + "\n" for r in rows)


def results_parquet(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in RESULT_COLUMNS} for r in rows]), buf)
    return buf.getvalue()


async def load(settings: Settings, run_id: str) -> RunExport:
    conn = await asyncpg.connect(settings.database_url)
    try:
        run = await queries.run(conn, run_id, "status, manifest")
        if run is None:
            raise LookupError(f"no run {run_id!r}")
        summary = await summarise(conn, run_id)
        rows = await queries.results(conn, run_id, RESULT_COLUMNS)
    finally:
        await conn.close()
    manifest = json.loads(run["manifest"]) if run["manifest"] else {}
    return RunExport(run_id, summary, manifest, [dict(r) for r in rows])


# --------------------------------------------------------------------------- the trackers


def to_wandb(
    run: RunExport, *, project: str, entity: str | None, directory: str, offline: bool
) -> dict[str, Any]:
    import wandb

    tracker = wandb.init(
        project=project,
        entity=entity,
        name=run.run_id,
        dir=directory,
        mode="offline" if offline else None,
        job_type="evaluation",
        config=flatten(run.manifest),
        tags=[f"model:{run.summary.get('model')}"[:64]],
        notes=f"evalstream run {run.run_id}",
        reinit="create_new",
    )
    try:
        numbers = metrics(run.summary)
        table = wandb.Table(
            columns=list(RESULT_COLUMNS), data=[[r.get(c) for c in RESULT_COLUMNS] for r in run.rows]
        )
        tracker.log({"results": table})
        tracker.summary.update({**numbers, **run.tags()})
        with tempfile.TemporaryDirectory() as tmp:
            manifest = Path(tmp) / "manifest.json"
            manifest.write_text(json.dumps(run.manifest, indent=2, sort_keys=True))
            artifact = wandb.Artifact(f"manifest-{run.run_id}", type="evalstream-manifest")
            artifact.add_file(str(manifest))
            tracker.log_artifact(artifact)
        return {"tracker": "wandb", "run": tracker.id, "dir": tracker.dir, "metrics": numbers}
    finally:
        tracker.finish()
        # finish() returns before wandb's core process has written out the run file; only
        # teardown waits for it, so that the offline files are whole when this returns.
        wandb.teardown()


def to_mlflow(run: RunExport, *, tracking_uri: str, experiment: str) -> dict[str, Any]:
    import mlflow

    if tracking_uri.startswith("file:"):
        # A local file store, asked for by name: MLflow 3 keeps it in maintenance mode and
        # refuses it unless told that it is wanted (a database store needs full mlflow). A
        # write for the library, not a setting of ours.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name=run.run_id, tags=run.tags()) as active:
        params = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in flatten(run.manifest).items()}
        items = sorted((k[:250], v[:MAX_PARAM_CHARS]) for k, v in params.items())
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params(dict(items[i : i + 100]))
        numbers = metrics(run.summary)
        mlflow.log_metrics(numbers)
        mlflow.log_dict(run.manifest, "manifest.json")
        mlflow.log_dict(run.summary, "report.json")
        mlflow.log_text(results_jsonl(run.rows), "results/results.jsonl")
        with tempfile.TemporaryDirectory() as tmp:
            parquet = Path(tmp) / "results.parquet"
            parquet.write_bytes(results_parquet(run.rows))
            mlflow.log_artifact(str(parquet), "results")
        return {"tracker": "mlflow", "run": active.info.run_id, "uri": tracking_uri, "metrics": numbers}


async def export_run(settings: Settings, run_id: str, tracker: str, **options: Any) -> dict[str, Any]:
    """The run to `tracker`, with its options (to_wandb's or to_mlflow's keywords)."""
    run = await load(settings, run_id)
    if tracker == "wandb":
        return await asyncio.to_thread(to_wandb, run, **options)
    return await asyncio.to_thread(to_mlflow, run, **options)


def default_options(tracker: str) -> dict[str, Any]:
    """A tracker's options from the environment (its own variables: WANDB_*, MLFLOW_*)."""
    defaults = ExportSettings.from_env()
    if tracker == "wandb":
        return {
            "project": defaults.wandb_project,
            "entity": defaults.wandb_entity or None,
            "directory": defaults.wandb_dir,
            "offline": False,
        }
    return {"tracking_uri": defaults.mlflow_tracking_uri, "experiment": defaults.mlflow_experiment_name}


async def export_on_completion(settings: Settings, run_id: str, trackers: list[str]) -> None:
    """`evalctl submit --wait --export T`: each tracker with its defaults (environment)."""
    for tracker in trackers:
        done = await export_run(settings, run_id, tracker, **default_options(tracker))
        print(f"exported {run_id} to {tracker}: run {done['run']}", file=sys.stderr)
