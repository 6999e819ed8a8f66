"""`evalctl export` on a real run, without a network: the W&B offline run file and the MLflow
file store carry the same accuracy, counts and latency as `evalctl report --json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalstream.common.settings import Settings
from tests.e2e.helpers import evalctl, write_jsonl
from tests.replay_files import replay_dir
from tests.support import wandb_records

pytestmark = pytest.mark.stack

ITEMS = [
    {
        "id": f"e{i:02d}",
        "question": f"What is {i} + 1?",
        "answer": str(i + 1),
        "category": ["add", "sum"][i % 2],
    }
    for i in range(12)
]
# answers produced elsewhere: two in three right, so that accuracy and categories differ
ANSWERS = [{"id": it["id"], "response": it["answer"] if i % 3 else "0"} for i, it in enumerate(ITEMS)]


def test_tracker_exports_equal_the_report(
    stack: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = write_jsonl(tmp_path / "export.jsonl", ITEMS)
    mlruns = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{mlruns}")  # evalctl's default store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this process's reader too
    # opt-in export on completion, through submit
    proc = evalctl(
        "submit",
        str(dataset),
        "--model",
        f"replay:{write_jsonl(replay_dir() / 'answers.jsonl', ANSWERS)}",
        "--wait",
        "--json",
        "--timeout",
        "300",
        "--export",
        "mlflow",
        timeout=400,
    )
    run_id = json.loads(proc.stdout.strip().splitlines()[-1])["run_id"]
    report = json.loads(evalctl("report", run_id, "--json").stdout.strip().splitlines()[-1])
    assert report["total"] == 12 and report["accuracy"] == pytest.approx(8 / 12)
    assert set(report["by_category"]) == {"add", "sum"}

    # W&B, offline, by hand
    wandb_dir = tmp_path / "wandb-files"
    wandb_dir.mkdir()
    evalctl("export", "wandb", run_id, "--offline", "--dir", str(wandb_dir), "--project", "evalstream-e2e")
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    summary: dict[str, object] = {}
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "summary":
            summary.update(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update}
            )
    # MLflow, from the submit's export (default store: the tracking URI in the environment)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{mlruns}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "evalstream"]
    (run,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`evalstream.run_id` = '{run_id}'"
    )
    metrics = run.data.metrics

    for tracked in (summary, metrics):
        assert tracked["accuracy"] == pytest.approx(report["accuracy"])
        for key in ("total", "succeeded", "failed", "cache_hits"):
            assert tracked[key] == report[key], key
        for p in ("p50", "p95", "p99"):
            assert tracked[f"latency_ms/{p}"] == pytest.approx(report["latency_ms"][p])
        for category, c in report["by_category"].items():
            assert tracked[f"category/{category}/accuracy"] == pytest.approx(c["accuracy"])
            assert tracked[f"category/{category}/total"] == c["total"]
    assert run.data.params["generation.max_tokens"] == "256"
    assert run.data.tags["evalstream.manifest_sha256"] == report["manifest_sha256"]
