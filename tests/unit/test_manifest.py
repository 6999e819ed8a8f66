"""Run manifests: what the hash covers (and what it must not), its stability across file
order, file format, processes and machines, the templates and grader versions it records,
and how `evalctl reproduce` turns a manifest back into a job."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from evalstream.cli.reproduce import plan_reproduction, request_from_manifest
from evalstream.common import manifest as manifest_mod
from evalstream.common.datasets import LoadedDataset, load_dataset
from evalstream.common.graders import DEFAULT_TEMPLATES, grader_problem, graders_for
from evalstream.common.manifest import build_manifest, hashed_part, manifest_differences, manifest_sha256
from evalstream.common.messages import GenerationParams, Item, JobSpec, RetryPolicy, Shard
from evalstream.common.specs import DEFAULT_MODEL
from evalstream.worker.grading import grader_version as worker_grader_version
from evalstream.worker.prompting import build_messages

ROOT = Path(__file__).resolve().parents[2]
CODE = {"package": "0.1.0", "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False}
# A manifest as stored, and its hash. It pins the canonical form (key order, separators,
# floats, non-ASCII text): if the hash of this literal changes, no stored manifest hash
# matches a new one any more, so change it only on purpose (with MANIFEST_VERSION).
STORED: dict[str, Any] = {
    "manifest_version": 2,
    "dataset": {"content_sha256": "ab" * 32, "items": 3},
    "model": {"spec": "hf:smollm2-135m-instruct", "sla_fallback": False},
    "generation": {"max_tokens": 32, "temperature": 0.7, "top_p": 0.95, "seed": 7, "stop": ["\n\n"]},
    "seed": 7,
    "prompt": {
        "templates": {"numeric": "{question}\n\nRéponds par un nombre."},
        "templates_sha256": "cd" * 32,
        "system_prompt": "Sois bref ✓",
        "system_prompt_sha256": "ef" * 32,
    },
    "grader": {"name": "numeric", "version": "numeric/2 clean/1"},
    "code": CODE,
    "source": {"uri": "s3://b/datasets/x/items.jsonl", "uploaded": "s3://b/uploads/y/a.csv", "filename": "a.csv", "sha256": "00" * 32, "format": "csv"},
    "execution": {"shard_size": 32, "shard_count": 1, "retry": {}, "worker_group": None, "bypass_cache": False, "prompt_template": None},
}  # fmt: skip
STORED_SHA256 = "9f6ba5c9f007fe4aebd129013ff9a57081ac643558a3a08a36ac5fc3c5da0728"

RECORDS: list[dict[str, Any]] = [
    {"id": "q1", "question": "What is 2 + 3?", "answer": "5", "category": "arithmetic"},
    {"id": "q2", "question": "Capital of France?", "answer": "Paris", "choices": ["Paris", "Rome"]},
    {"id": "q3", "question": "Colour of the sky?", "answer": "blue", "meta": {"source": "demo"}},
    {"id": "q4", "question": "What is 12 * 12?", "answer": "144", "category": "arithmetic"},
]


@pytest.fixture(autouse=True)
def fixed_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code version is the only part that depends on the checkout: pin it."""
    monkeypatch.setattr(manifest_mod, "code_version", lambda: dict(CODE))


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def csv_bytes(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=["id", "question", "answer", "choices", "category", "meta"])
    w.writeheader()
    for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in r.items()})
    return out.getvalue().encode()


def manifest_of(loaded: LoadedDataset, job: JobSpec | None = None, **job_changes: Any) -> dict[str, Any]:
    job = msgspec.structs.replace(
        job or JobSpec(dataset=f"s3://uploads/{loaded.filename}", shard_size=32), **job_changes
    )
    return build_manifest(
        job,
        dataset_uri=f"s3://evalstream-datasets/datasets/{loaded.content_sha256}/items.jsonl",
        dataset_sha256=loaded.sha256,
        content_sha256=loaded.content_sha256,
        dataset_format=loaded.format,
        total=len(loaded.items),
        shard_count=1 + len(loaded.items) // (job.shard_size or 32),
        filename=loaded.filename,
    )


def reference_manifest() -> dict[str, Any]:
    return manifest_of(load_dataset(jsonl(RECORDS), "reference.jsonl"))


def test_same_items_in_any_order_and_format_give_the_same_manifest_hash() -> None:
    shuffled = RECORDS[:]
    random.Random(3).shuffle(shuffled)
    copies = [
        load_dataset(jsonl(RECORDS), "bench.jsonl"),
        load_dataset(jsonl(shuffled), "renamed copy.jsonl"),
        load_dataset(csv_bytes(shuffled), "bench.csv"),
    ]
    manifests = [manifest_of(d) for d in copies]
    assert len({d.content_sha256 for d in copies}) == 1
    assert len({manifest_sha256(m) for m in manifests}) == 1
    # what must differ does, outside the hash: the uploaded file
    assert len({m["source"]["sha256"] for m in manifests}) == 3
    assert [m["source"]["format"] for m in manifests] == ["jsonl", "jsonl", "csv"]
    assert manifest_differences(manifests[0], manifests[2]) == []


def test_manifest_hash_is_pinned() -> None:
    assert manifest_sha256(STORED) == STORED_SHA256
    # what it is: sha256 of the canonical JSON of everything but "source" and "execution"
    hashed = {k: v for k, v in STORED.items() if k not in ("source", "execution")}
    canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert hashlib.sha256(canonical.encode()).hexdigest() == STORED_SHA256


def test_manifest_hash_is_independent_of_the_process() -> None:
    digest = manifest_sha256(reference_manifest())
    # another interpreter, another hash seed, another working directory: the same hash
    script = (
        "from evalstream.common import manifest as m\n"
        f"m.code_version = lambda: {CODE!r}\n"
        "from tests.unit.test_manifest import reference_manifest\n"
        "print(m.manifest_sha256(reference_manifest()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd="/",
        # the same code as this process imports (its PYTHONPATH, if any, after the checkout)
        env={
            **os.environ,
            "PYTHONHASHSEED": "12345",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        check=True,
    )
    assert out.stdout.strip() == digest


@pytest.mark.parametrize(
    "change",
    [
        {"model": "null"},
        {"grader": "numeric"},
        {"generation": GenerationParams(temperature=0.7)},
        {"generation": GenerationParams(max_tokens=32)},
        {"generation": GenerationParams(seed=1)},
        {"generation": GenerationParams(stop=["\n"])},
        {"prompt_template": "Q: {question}\nA:"},
        {"system_prompt": "Be brief."},
        {"sla_fallback": True},
    ],
    ids=lambda c: next(iter(c)),
)
def test_hash_changes_with_what_determines_the_results(change: dict[str, Any]) -> None:
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    assert manifest_sha256(manifest_of(loaded, **change)) != manifest_sha256(manifest_of(loaded))


@pytest.mark.parametrize(
    "change",
    [
        {"shard_size": 7},
        {"retry": RetryPolicy(max_attempts=5)},
        {"worker_group": "gpu-a"},
        {"bypass_cache": True},
        {"name": "another name"},
        {"run_id": "run-other"},
        {"dataset": "s3://elsewhere/uploads/x/other.jsonl"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_hash_ignores_how_a_run_was_submitted_and_executed(change: dict[str, Any]) -> None:
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    changed = manifest_of(loaded, **change)
    assert manifest_sha256(changed) == manifest_sha256(manifest_of(loaded))
    assert "run_id" not in json.dumps(hashed_part(changed))


def test_hash_changes_with_a_gold_label_and_with_the_code() -> None:
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    relabelled = load_dataset(jsonl([*RECORDS[:3], {**RECORDS[3], "answer": "143"}]), "a.jsonl")
    a, b = manifest_of(loaded), manifest_of(relabelled)
    assert manifest_sha256(a) != manifest_sha256(b)
    assert manifest_differences(a, b) == ["dataset.content_sha256"]
    other_code = {**a, "code": {**CODE, "git_dirty": True}}
    assert manifest_sha256(other_code) != manifest_sha256(a)
    assert manifest_differences(a, other_code) == ["code.git_dirty"]


def test_manifest_records_everything_the_issue_names() -> None:
    m = reference_manifest()
    assert m["dataset"]["content_sha256"] == load_dataset(jsonl(RECORDS), "x.jsonl").content_sha256
    assert m["model"] == {"spec": DEFAULT_MODEL, "sla_fallback": False}
    assert m["generation"] == {"max_tokens": 256, "temperature": 0.0, "top_p": 1.0, "seed": 0, "stop": []}
    assert m["seed"] == 0
    assert m["grader"] == {"name": "auto", "version": worker_grader_version("auto")}
    assert m["code"] == CODE
    assert m["source"]["uri"].endswith(f"/datasets/{m['dataset']['content_sha256']}/items.jsonl")
    assert len(m["prompt"]["templates_sha256"]) == 64 and m["prompt"]["system_prompt"] is None


def test_recorded_templates_are_the_ones_workers_apply() -> None:
    """The manifest's templates per grader, filled in, are exactly the prompt a worker builds."""
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    for template in (None, "Question: {question}\nAnswer:"):
        templates = manifest_of(loaded, prompt_template=template)["prompt"]["templates"]
        assert sorted(templates) == graders_for("auto")
        shard = Shard(
            run_id="r", shard_id="s", shard_index=0, shard_count=1, model="null", grader="auto",
            generation=GenerationParams(), items=[], prompt_template=template,
        )  # fmt: skip
        item = Item(id="q", question="What is 2 + 3?", answer="5")
        for grader, text in templates.items():
            (message,) = build_messages(shard, item, grader)
            assert message.content == text.replace("{question}", item.question or "").replace("{choices}", "")
    assert templates == dict.fromkeys(templates, "Question: {question}\nAnswer:")
    defaults = manifest_of(loaded)["prompt"]["templates"]
    assert defaults == {g: DEFAULT_TEMPLATES.get(g, "{question}") for g in graders_for("auto")}


def test_an_explicit_template_equal_to_the_default_is_the_same_run() -> None:
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    default = manifest_of(loaded, grader="numeric")
    explicit = manifest_of(loaded, grader="numeric", prompt_template=DEFAULT_TEMPLATES["numeric"])
    assert manifest_sha256(default) == manifest_sha256(explicit)
    assert default["prompt"]["templates"] == {"numeric": DEFAULT_TEMPLATES["numeric"]}


def test_code_version_reads_git_or_the_image_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real code_version, not the fixture's
    code_version = manifest_mod.code_version
    code_version.cache_clear()
    try:
        here = code_version()
        assert here["package"] == "0.1.0"
        assert here["git_commit"] is None or re.fullmatch("[0-9a-f]{40}", here["git_commit"])
        assert (here["git_dirty"] is None) == (here["git_commit"] is None)
        monkeypatch.setenv("EVALSTREAM_GIT_COMMIT", "f" * 40)  # an image built without .git
        code_version.cache_clear()
        assert code_version() == {"package": "0.1.0", "git_commit": "f" * 40, "git_dirty": None}
    finally:
        monkeypatch.undo()
        code_version.cache_clear()


# ----------------------------------------------------------------------------- reproduce


def plan(manifest: dict[str, Any], **facts: Any) -> Any:
    return plan_reproduction(
        "run-old",
        manifest,
        new_run_id="run-new",
        dataset_problem=facts.get("dataset_problem"),
        serving_groups=facts.get("serving_groups", ["default"]),
        code=facts.get("code", CODE),
    )


def test_reproduction_job_asks_for_the_same_run_without_the_cache() -> None:
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    m = manifest_of(
        loaded,
        model="replay:/data/answers.jsonl",
        grader="numeric",
        generation=GenerationParams(max_tokens=32, seed=4),
        system_prompt="Be brief.",
        shard_size=3,
        sla_fallback=True,
    )
    p = plan(m)
    assert p.blockers == [] and p.job is not None
    assert p.warnings == ["the run allowed an SLA fallback model; the reproduction does not"]
    job = p.job
    assert (job.dataset, job.model, job.grader) == (
        m["source"]["uri"],
        "replay:/data/answers.jsonl",
        "numeric",
    )
    assert job.generation == GenerationParams(max_tokens=32, seed=4)
    assert (job.system_prompt, job.prompt_template, job.shard_size) == ("Be brief.", None, 3)
    assert job.bypass_cache and not job.sla_fallback and job.run_id == "run-new"
    # the job builds the same manifest, apart from what the hash leaves out
    again = manifest_of(loaded, msgspec.structs.replace(job, sla_fallback=True))
    assert manifest_sha256(again) == manifest_sha256(m)


def test_reproduction_refuses_with_the_reasons() -> None:
    m = reference_manifest()
    p = plan(
        m, dataset_problem="the dataset copy s3://x is no longer available (NoSuchKey)", serving_groups=[]
    )
    assert p.job is None
    assert p.blockers == [
        "the dataset copy s3://x is no longer available (NoSuchKey)",
        f"no live worker group serves model {DEFAULT_MODEL!r} (see `evalctl workers`)",
    ]
    gone = {**m, "grader": {"name": "fuzzy", "version": "fuzzy/1"}}
    assert plan(gone).blockers == [f"grader no longer available: {grader_problem('fuzzy')}"]


def test_reproduction_warns_about_code_and_grader_versions() -> None:
    m = reference_manifest()
    older = {**m, "grader": {"name": "auto", "version": "auto/0 numeric/0 clean/1"}}
    p = plan(older, code={**CODE, "git_commit": "f" * 40})
    assert p.job is not None and p.blockers == []
    assert p.warnings[0].startswith("grader version changed: auto/0 numeric/0 clean/1 -> auto/1")
    assert p.warnings[1] == "code version differs: run 0.1.0 0123456789ab, here 0.1.0 ffffffffffff"


def test_changed_default_templates_are_pinned_or_refused() -> None:
    loaded = load_dataset(jsonl(RECORDS), "a.jsonl")
    one = manifest_of(loaded, grader="numeric")
    one["prompt"]["templates"] = {"numeric": "Old: {question}"}
    p = plan(one)
    assert p.job is not None and p.job.prompt_template == "Old: {question}"
    auto = reference_manifest()
    auto["prompt"]["templates"] = {**auto["prompt"]["templates"], "exact": "Old: {question}"}
    refused = plan(auto)
    assert refused.job is None and "default prompt templates of exact changed" in refused.blockers[0]


def test_manifests_from_before_version_2_can_be_reproduced() -> None:
    v1 = {
        "dataset": {"uri": "s3://d/datasets/abc/items.jsonl", "sha256": "x", "content_sha256": "abc", "format": "jsonl", "items": 2},
        "model": "null", "grader": "auto", "generation": {"max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "seed": 0, "stop": []},
        "prompt_template": None, "system_prompt": None, "shard_size": 32, "shard_count": 1,
        "retry": {"max_attempts": 3, "base_delay_s": 1.0, "multiplier": 4.0}, "seed": 0, "code": CODE,
    }  # fmt: skip
    req = request_from_manifest(v1)
    assert (req.dataset_uri, req.model, req.templates, req.grader_version) == (
        "s3://d/datasets/abc/items.jsonl",
        "null",
        None,
        None,
    )
    p = plan(v1)
    assert p.job is not None and p.job.generation.max_tokens == 8 and p.job.dataset == req.dataset_uri
