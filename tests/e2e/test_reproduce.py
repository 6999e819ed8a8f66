"""Issue 9 on the real stack: reproducing a run, dataset versions, and refusals."""

from __future__ import annotations

import csv
import json
import random
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from evalstream.common import storage
from evalstream.common.settings import Settings, WorkerSettings
from evalstream.common.specs import DEFAULT_MODEL, alias_engine, parse_model_spec
from evalstream.worker.engines import bundled_model_path, device_kind
from evalstream.worker.engines.hf import file_sha256
from tests.e2e.helpers import evalctl, results_jsonl, submit_wait, write_jsonl
from tests.support import admin_settings

pytestmark = pytest.mark.stack


def last_json(stdout: str) -> Any:
    return json.loads(stdout.strip().splitlines()[-1])


def nonce() -> str:
    return uuid.uuid4().hex[:8]


@pytest.mark.model
def test_reproducing_a_greedy_run_with_the_default_model(tmp_path: Path) -> None:
    # questions no earlier run has asked (the nonce), so that the first run really runs the model
    tag = nonce()
    rows = [
        {"id": f"r{i}", "question": f"What is {a} + {b}? (set {tag})", "answer": str(a + b), "category": "arithmetic"}
        for i, (a, b) in enumerate([(2, 3), (7, 8), (12, 30), (9, 9), (25, 17), (40, 2), (6, 1), (11, 11)])
    ]  # fmt: skip
    original = submit_wait(write_jsonl(tmp_path / "greedy.jsonl", rows), "--max-tokens", "32", timeout=600)
    assert original["status"] == "completed" and original["failed"] == 0

    report = last_json(
        evalctl("reproduce", original["run_id"], "--wait", "--json", "--timeout", "600").stdout
    )
    again = report["reproduction"]
    assert report["original"] == original["run_id"] and again != original["run_id"]
    assert report["items"] == 8 and report["identical_answers"] == 8 and report["all_identical"]
    assert report["accuracy"]["original"] == report["accuracy"]["reproduction"] == original["accuracy"]
    assert report["accuracy"]["delta"] == 0.0
    # the model ran twice: neither run was served from the answer cache
    assert report["cache_hits"] == {"original": 0, "reproduction": 0}
    first, second = results_jsonl(original["run_id"]), results_jsonl(again)
    assert [r["response"] for r in first] == [r["response"] for r in second]
    assert all(r["response"] for r in first), "the model answered every item"
    assert not any(r["cache_hit"] for r in first + second)
    # the default SPEC (the bundled model's name) on this machine's fastest faithful engine
    engine = alias_engine(parse_model_spec(DEFAULT_MODEL), WorkerSettings().worker_model, device_kind())
    assert engine == ("ov:smollm2-135m-instruct" if device_kind() == "cpu" else "hf:smollm2-135m-instruct")
    assert {r["served_by"] for r in first + second} == {f"default/{engine}"}
    # the same weights served both, and the manifests agree (the commit may move under a busy tree)
    revisions = report["served_revisions"]
    assert revisions["identical"]
    (served,) = revisions["reproduction"].values()
    weights = file_sha256(bundled_model_path("smollm2-135m-instruct"))
    assert len(served) == 1 and next(iter(served)).startswith(f"{weights}+")  # GGUF sha256 + dtype
    assert set(report["manifest_sha256"]["differences"]) <= {"code.git_commit", "code.git_dirty"}
    # the answers were in the cache all along: a reproduction that may use it is served from it
    cached = last_json(evalctl("reproduce", original["run_id"], "--cache", "--wait", "--json").stdout)
    assert cached["cache_hits"]["reproduction"] == 8 and cached["all_identical"]
    # the comparison of the same two runs through `evalctl compare`
    compared = last_json(evalctl("compare", original["run_id"], again, "--json").stdout)
    assert compared["identical_responses"] == 8 and compared["mcnemar"]["p_value"] == 1.0


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "question", "answer", "category"])
        w.writeheader()
        w.writerows(rows)
    return path


async def test_dataset_versions_follow_content_not_files(tmp_path: Path, pg: asyncpg.Connection) -> None:
    tag = nonce()
    rows = [
        {"id": f"v{i}", "question": f"What is {i} * 3? ({tag})", "answer": str(3 * i), "category": "times"}
        for i in range(30)
    ]
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    first = submit_wait(write_jsonl(tmp_path / "bench.jsonl", rows), "--model", "null")
    copy = submit_wait(write_csv(tmp_path / "bench-copy.csv", shuffled), "--model", "null")
    # the same items, shuffled, in CSV under another name: the same version and the same manifest
    assert first["dataset_sha256"] == copy["dataset_sha256"]
    assert first["manifest_sha256"] == copy["manifest_sha256"]
    version = first["dataset_sha256"]
    listed = {v["content_sha256"]: v for v in last_json(evalctl("datasets", "list", "--json").stdout)}
    assert listed[version]["names"] == ["bench.jsonl", "bench-copy.csv"]
    assert listed[version]["items"] == 30 and listed[version]["runs"] == 2
    assert listed[version]["first_run_id"] == first["run_id"]
    # a fixed label and a reworded question make a new version
    changed = [dict(r) for r in rows]
    changed[4]["answer"] = "13"
    changed[7]["question"] = f"Multiply 7 by 3. ({tag})"
    del changed[29]
    second = submit_wait(write_jsonl(tmp_path / "bench.jsonl", changed), "--model", "null")
    assert second["dataset_sha256"] != version and second["manifest_sha256"] != first["manifest_sha256"]
    d = last_json(evalctl("datasets", "diff", version[:12], second["dataset_sha256"][:12], "--json").stdout)
    assert [e["id"] for e in d["answer_changed"]] == ["v4"]
    assert d["answer_changed"][0]["a"] == {"answer": "12"} and d["answer_changed"][0]["b"] == {"answer": "13"}
    assert [e["id"] for e in d["question_changed"]] == ["v7"]
    assert d["removed"] == ["v29"] and d["added"] == [] and d["unchanged"] == 27 and not d["identical"]
    # a file and a stored version compare the same way; the human-readable diff names the items
    same = last_json(
        evalctl("datasets", "diff", str(tmp_path / "bench-copy.csv"), version[:16], "--json").stdout
    )
    assert same["identical"] and same["unchanged"] == 30
    text = evalctl("datasets", "diff", version[:12], second["dataset_sha256"][:12]).stdout
    assert "~ v4 answer: '12' -> '13'" in text and "- v29" in text
    versions_row = await pg.fetchrow("SELECT * FROM dataset_versions WHERE content_sha256 = $1", version)
    assert versions_row["name"] == "bench.jsonl" and versions_row["uri"].endswith(
        f"/datasets/{version}/items.jsonl"
    )
    # an unknown version is refused with its reason
    bad = evalctl("datasets", "diff", "0000000000", version[:12], check=False)
    assert bad.returncode == 2 and "no dataset version" in bad.stderr


async def test_reproduce_refuses_when_a_part_is_gone(
    tmp_path: Path, pg: asyncpg.Connection, pg_admin: asyncpg.Connection, stack: Settings
) -> None:
    rows = [{"id": f"g{i}", "question": f"Gone {nonce()} {i}?", "answer": str(i)} for i in range(3)]
    run = submit_wait(write_jsonl(tmp_path / "gone.jsonl", rows), "--model", "null")
    manifest = json.loads(await pg.fetchval("SELECT manifest FROM runs WHERE run_id = $1", run["run_id"]))
    # a model no live worker group serves (a run recorded by another deployment, say)
    fake = f"run-fake-{nonce()}"
    elsewhere = {**manifest, "model": {"spec": "hf:/opt/models/retired", "sla_fallback": False}}
    await pg_admin.execute(
        "INSERT INTO runs (run_id, status, model, grader, spec, manifest) VALUES ($1, 'completed', $2, 'auto', '{}', $3)",
        fake,
        "hf:/opt/models/retired",
        json.dumps(elsewhere),
    )
    try:
        refused = evalctl("reproduce", fake, check=False)
        assert refused.returncode == 2
        assert "no live worker group serves model 'hf:/opt/models/retired'" in refused.stderr
    finally:
        await pg_admin.execute("DELETE FROM runs WHERE run_id = $1", fake)
    # the dataset's stored copy deleted (its content is unique to this test)
    bucket, key = storage.parse_s3_uri(manifest["source"]["uri"])
    storage.client(admin_settings()).remove_object(bucket, key)  # only the admin deletes copies
    refused = evalctl("reproduce", run["run_id"], check=False)
    assert refused.returncode == 2
    assert f"the dataset copy {manifest['source']['uri']} is no longer available" in refused.stderr
    # nothing was submitted
    assert await pg.fetchval("SELECT count(*) FROM runs WHERE name = $1", f"reproduce {run['run_id']}") == 0
