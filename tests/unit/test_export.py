"""Experiment-tracker export without a network: W&B in offline mode (its run file read
back record by record) and MLflow against a local file store carry the run's numbers,
per-category accuracy, latency percentiles, manifest and results table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalstream.cli.trackers import RunExport, metrics, to_mlflow, to_wandb
from tests.support import wandb_records

SUMMARY: dict[str, Any] = {
    "run_id": "run-exp-1",
    "status": "completed",
    "total": 3,
    "succeeded": 2,
    "failed": 1,
    "accuracy": 1 / 3,
    "accuracy_answered": 0.5,
    "latency_ms": {"p50": 10.0, "p95": 19.0, "p99": 19.8},
    "items_per_s": 12.5,
    "duration_s": 0.24,
    "cache_hits": 1,
    "retried": 1,
    "truncated": 0,
    "tokens": {"prompt": 30, "completion": 7},
    "model": "null",
    "grader": "auto",
    "dataset_sha256": "d" * 64,
    "manifest_sha256": "m" * 64,
    "by_category": {
        "math": {"total": 2, "accuracy": 0.5, "failed": 0},
        "geo graphy/€": {"total": 1, "accuracy": 0.0, "failed": 1},
    },
}
MANIFEST = {"model": "null", "generation": {"max_tokens": 8, "temperature": 0.0}, "dataset": {"items": 3}}
ROWS = [
    {"item_id": "a", "category": "math", "response": "4", "correct": True, "score": 1.0, "latency_ms": 10.0},
    {"item_id": "b", "category": "math", "response": "5", "correct": False, "score": 0.0, "latency_ms": 20.0},
    {"item_id": "c", "category": "geo graphy/€", "error": "boom", "score": 0.0, "attempts": 3},
]
RUN = RunExport("run-exp-1", SUMMARY, MANIFEST, ROWS)


def test_metrics_are_the_summarys_numbers_with_categories_and_percentiles() -> None:
    m = metrics(SUMMARY)
    assert m["accuracy"] == pytest.approx(1 / 3) and (m["total"], m["succeeded"], m["failed"]) == (3, 2, 1)
    assert (m["latency_ms/p50"], m["latency_ms/p95"], m["latency_ms/p99"]) == (10.0, 19.0, 19.8)
    assert m["category/math/accuracy"] == 0.5 and m["category/geo graphy/_/total"] == 1
    assert (
        metrics({**SUMMARY, "latency_ms": {"p50": None}, "accuracy": None})
        .keys()
        .isdisjoint({"latency_ms/p50", "accuracy"})
    )


def test_lm_eval_scores_are_metrics_with_their_stderr() -> None:
    acc = {"value": 0.27, "stderr": 0.023, "ci95": [0.22, 0.31], "n": 369}
    mc = metrics(
        {**SUMMARY, "scores": {"grader": "loglikelihood", "scored": 369, "acc": acc, "perplexity": 3.5}}
    )
    assert (mc["scores/acc"], mc["scores/acc/stderr"], mc["scores/perplexity"]) == (0.27, 0.023, 3.5)
    assert mc["scores/scored"] == 369 and "scores/grader" not in mc
    em = {"value": 0.5, "stderr": 0.1, "ci95": None, "n": 20}
    gen = metrics(
        {**SUMMARY, "scores": {"grader": "lm_eval", "filters": [{"name": "strict-match", "exact_match": em}]}}
    )
    assert (gen["scores/exact_match/strict-match"], gen["scores/exact_match/strict-match/stderr"]) == (
        0.5,
        0.1,
    )


def test_wandb_offline_run_carries_the_numbers_config_and_table(tmp_path: Path) -> None:
    done = to_wandb(RUN, project="evalstream-test", entity=None, directory=str(tmp_path), offline=True)
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    summary: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update}
            )
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert run.display_name == "run-exp-1"
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (3, 2, 1)
    assert summary["category/math/accuracy"] == 0.5 and summary["latency_ms/p95"] == 19.0
    assert summary["evalstream.manifest_sha256"] == "m" * 64
    assert config["generation.max_tokens"] == 8 and config["model"] == "null"
    (table_file,) = tmp_path.glob("wandb/offline-run-*/files/media/table/results_*.table.json")
    table = json.loads(table_file.read_text())
    item, error = table["columns"].index("item_id"), table["columns"].index("error")
    assert [(r[item], r[error]) for r in table["data"]] == [("a", None), ("b", None), ("c", "boom")]
    assert done["metrics"]["total"] == 3


def test_mlflow_file_store_run_carries_the_numbers_params_and_artifacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # set by to_mlflow too; not relied upon

    uri = f"file:{tmp_path / 'mlruns'}"
    done = to_mlflow(RUN, tracking_uri=uri, experiment="evalstream-test")
    run = MlflowClient(tracking_uri=uri).get_run(done["run"])
    assert run.info.run_name == "run-exp-1"
    assert run.data.metrics["accuracy"] == pytest.approx(1 / 3)
    assert (run.data.metrics["total"], run.data.metrics["succeeded"], run.data.metrics["failed"]) == (3, 2, 1)
    assert run.data.metrics["category/math/accuracy"] == 0.5 and run.data.metrics["latency_ms/p99"] == 19.8
    assert run.data.params["generation.max_tokens"] == "8" and run.data.params["model"] == "null"
    assert run.data.tags["evalstream.dataset_sha256"] == "d" * 64
    artifacts = Path(run.info.artifact_uri.removeprefix("file://").removeprefix("file:"))
    assert json.loads((artifacts / "manifest.json").read_text()) == MANIFEST
    lines = [json.loads(line) for line in (artifacts / "results/results.jsonl").read_text().splitlines()]
    assert [(r["item_id"], r["error"]) for r in lines] == [("a", None), ("b", None), ("c", "boom")]
    import pyarrow.parquet as pq

    assert pq.read_table(artifacts / "results/results.parquet").column("item_id").to_pylist() == [
        "a",
        "b",
        "c",
    ]
