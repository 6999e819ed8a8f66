"""The real default model (SmolLM2-135M-Instruct, on the worker's fastest faithful engine:
`ov:` on a CPU) through the whole pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalstream.common.settings import WorkerSettings
from evalstream.common.specs import DEFAULT_MODEL, alias_engine, parse_model_spec
from evalstream.worker.engines import device_kind
from tests.e2e.helpers import results_jsonl, submit_wait
from tests.support import sample_path

pytestmark = [pytest.mark.stack, pytest.mark.model]


def pick(path: Path, per_category: int) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out: list[dict[str, object]] = []
    for cat in sorted({str(r.get("category")) for r in rows}):
        out += [r for r in rows if str(r.get("category")) == cat][:per_category]
    return out


def test_mixed_set_with_default_model(tmp_path: Path) -> None:
    questions = pick(sample_path("demo.jsonl"), 4)  # arithmetic, factual, word problems
    code = pick(sample_path("demo_code.jsonl"), 2)
    qa = tmp_path / "mixed.jsonl"
    qa.write_text("".join(json.dumps(r) + "\n" for r in questions))
    cq = tmp_path / "code.jsonl"
    cq.write_text("".join(json.dumps(r) + "\n" for r in code))
    for dataset, items, tokens in ((qa, questions, "64"), (cq, code, "160")):
        summary = submit_wait(dataset, "--max-tokens", tokens, timeout=900)
        records = results_jsonl(summary["run_id"])
        assert sorted(r["item_id"] for r in records) == sorted(
            str(i.get("id", i.get("task_id"))) for i in items
        )
        assert summary["status"] == "completed" and summary["failed"] == 0
        # the job names the bundled model; each answer names the engine the worker chose for its
        # device (the stack's worker runs on this machine, with the default allow-list)
        engine = alias_engine(parse_model_spec(DEFAULT_MODEL), WorkerSettings().worker_model, device_kind())
        assert summary["model"] == DEFAULT_MODEL and engine.startswith(
            "ov:" if device_kind() == "cpu" else "hf:"
        )
        assert all(r["served_by"] == f"default/{engine}" for r in records)
        assert list(summary["by_served_by"]) == [f"default/{engine}"]
        assert all(r["response"] for r in records), "the model answered every item"
        recomputed = sum(r["score"] for r in records) / len(records)
        assert summary["accuracy"] == pytest.approx(recomputed)
    # the model knows the capital of France; the report says what it got right
    factual = [r for r in results_jsonl(submit_wait(qa, "--max-tokens", "64")["run_id"])]
    assert all(r["cache_hit"] for r in factual), "an identical second run is served from the answer cache"
