"""The gold-label audit on the real stack: 500 items with 8 % planted label errors, three
models' answers replayed through the pipeline, then `evalctl audit` and `evalctl compare`."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import EVALCTL, ROOT, evalctl, results_jsonl, write_jsonl
from tests.replay_files import replay_dir
from tests.unit.test_audit import MODEL_ACCURACY, planted_dataset, recall_precision

pytestmark = pytest.mark.stack


def last_json(stdout: str) -> Any:
    return json.loads(stdout.strip().splitlines()[-1])


def test_audit_finds_planted_label_errors_in_replayed_runs(tmp_path: Path) -> None:
    p = planted_dataset()
    tag = uuid.uuid4().hex[:8]  # a version of its own, so that only this test's runs are on it
    rows = [{**r, "meta": {"set": tag}} for r in p.rows]
    dataset = write_jsonl(tmp_path / "planted.jsonl", rows)
    procs = {}
    for model, lines in p.answers.items():
        answers = write_jsonl(replay_dir() / f"{model}.jsonl", lines)
        argv = ["submit", str(dataset), "--model", f"replay:{answers}", "--shard-size", "100"]
        procs[model] = subprocess.Popen(
            [*EVALCTL, *argv, "--wait", "--json", "--timeout", "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
    runs = {model: last_json(proc.communicate(timeout=400)[0]) for model, proc in procs.items()}
    assert all(s["status"] == "completed" and s["failed"] == 0 for s in runs.values())
    assert len({s["dataset_sha256"] for s in runs.values()}) == 1

    # every completed run on this dataset version, found by its content
    report = last_json(evalctl("audit", "--dataset", str(dataset), "--json").stdout)
    assert sorted(report["runs"].values()) == sorted(s["run_id"] for s in runs.values())
    assert len(report["models"]) == 3 and report["items"] == 500 and report["grader"] == "auto"
    recall, precision = recall_precision(set(report["suspects"]), p.errors)
    print(f"audit: recall {recall:.3f}, precision {precision:.3f}, counts {report['counts']}")
    assert recall >= 0.9, sorted(p.errors - set(report["suspects"]))
    assert precision >= 0.8, sorted(set(report["suspects"]) - p.errors)
    assert set(report["counts"]) == {"conflicting_duplicate", "models_disagree_with_gold", "unparsable_gold"}
    scores = [f["score"] for f in report["flags"]]
    assert scores == sorted(scores, reverse=True)  # ranked by score
    flag = next(f for f in report["flags"] if f["kind"] == "models_disagree_with_gold")
    gold = next(r["answer"] for r in p.rows if r["id"] == flag["item_ids"][0])
    assert flag["evidence"]["gold"] == gold and flag["evidence"]["votes"] >= 2
    assert report["threshold"] is None and report["max_fdr"] == 0.1  # the default cut
    assert flag["evidence"]["q_value"] <= 0.1 and flag["evidence"]["suggested_gold"] is not None
    assert set(flag["evidence"]["accuracy"]) == set(report["models"])
    learned = report["reliability"]["accuracy"]
    for model, accuracy in MODEL_ACCURACY.items():  # each model's accuracy, learned from the runs
        model_spec = next(m for m in learned if model in m)
        assert abs(learned[model_spec] - accuracy) < 0.05, learned

    # the version by its hash prefix, two given runs, and the table
    two = ",".join(runs[m]["run_id"] for m in list(MODEL_ACCURACY)[:2])
    table = evalctl("audit", "--dataset", runs["model-a"]["dataset_sha256"][:12], "--runs", two).stdout
    assert "2 model(s)" in table and "models_disagree_with_gold" in table and "unparsable_gold" in table

    # the report beside the accuracy without the flagged items: higher, since the planted golds
    # marked right answers wrong; recomputable from the results
    a_run = runs["model-a"]["run_id"]
    rep = last_json(evalctl("report", a_run, "--json", "--exclude-flagged").stdout)["label_audit"]
    suspects = set(report["suspects"])
    graded = {r["item_id"]: float(r["score"] or 0.0) for r in results_jsonl(a_run)}
    assert rep["flagged"] == len(suspects) and len(rep["models"]) == 3
    assert rep["accuracy"] == pytest.approx(sum(graded.values()) / 500)
    kept = [v for i, v in graded.items() if i not in suspects]
    assert rep["accuracy_excluding_flagged"] == pytest.approx(sum(kept) / len(kept))
    assert rep["accuracy_excluding_flagged"] > rep["accuracy"] + 0.05
    text = evalctl("report", a_run, "--exclude-flagged").stdout
    assert f"accuracy without the {len(suspects)} item(s)" in text

    # compare two of the runs: the paired counts are those of the results
    a, b = (runs[m]["run_id"] for m in ("model-a", "model-c"))
    c = last_json(evalctl("compare", a, b, "--json").stdout)
    ra = {r["item_id"]: r["correct"] for r in results_jsonl(a)}
    rb = {r["item_id"]: r["correct"] for r in results_jsonl(b)}
    assert c["mcnemar"]["right_in_a_only"] == sum(ra[i] and not rb[i] for i in ra)
    assert c["mcnemar"]["right_in_b_only"] == sum(rb[i] and not ra[i] for i in ra)
    assert c["accuracy"]["delta"] == pytest.approx(runs["model-c"]["accuracy"] - runs["model-a"]["accuracy"])
    lo, hi = c["accuracy"]["ci"]
    assert lo < c["accuracy"]["delta"] < hi
    # model-c is weaker, but a 2.6-point gap on 500 items is within the noise: both tests say so
    assert c["accuracy"]["delta"] == pytest.approx(-0.026) and lo < 0 < hi and c["mcnemar"]["p_value"] > 0.05
    assert c["items"]["common"] == 500 and c["identical_responses"] < 500
