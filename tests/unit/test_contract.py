"""The published job contract: the checked-in schemas and AsyncAPI document are what the
code generates, the closed job contract rejects unknown fields by name, and the schemas
agree with the decoder on what a valid job is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest

from evalstream.common import contract
from evalstream.common.messages import SCHEMA_VERSION, ItemResult, ShardResult, encode

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_checked_in_documents_match_the_code() -> None:
    generated = contract.documents()
    stale = [
        name
        for name, text in generated.items()
        if not (DOCS / name).exists() or (DOCS / name).read_text() != text
    ]
    assert not stale, f"regenerate with `python -m evalstream.common.contract docs`: {stale} differ"
    on_disk = {str(p.relative_to(DOCS)) for p in (DOCS / "schemas").glob("*.json")}
    assert on_disk == {n for n in generated if n.startswith("schemas/")}, (
        "a schema file the code no longer makes"
    )


def test_every_schema_is_valid_json_schema() -> None:
    for name in contract.documents():
        if name.endswith(".json"):
            jsonschema.Draft202012Validator.check_schema(json.loads((DOCS / name).read_text()))


def test_asyncapi_names_the_public_topics_and_its_references_resolve() -> None:
    doc = json.loads((DOCS / "asyncapi.json").read_text())
    assert doc["asyncapi"] == "3.0.0"
    assert {c["address"] for c in doc["channels"].values()} == {"eval.jobs", "eval.results", "eval.dlq"}
    assert {o["action"] for o in doc["operations"].values()} == {"send", "receive"}

    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in refs(v)]
        return [r for v in node for r in refs(v)] if isinstance(node, list) else []

    for ref in refs(doc):
        if ref.startswith("#/"):
            target: Any = doc
            for step in ref[2:].split("/"):
                target = target[step]
        else:
            assert (DOCS / ref).is_file(), ref


def jobs_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((DOCS / "schemas/eval.jobs.schema.json").read_text()))


@pytest.mark.parametrize(
    "job",
    [
        {"dataset": "s3://uploads/q.jsonl"},
        {"dataset": "q.jsonl", "model": "null", "generation": {"max_tokens": 16, "stop": ["\n"]}},
        {"dataset": "q.jsonl", "retry": {"max_attempts": 2}, "run_id": "run-1", "schema_version": 1},
    ],
)
def test_valid_jobs_pass_both_the_schema_and_the_decoder(job: dict[str, Any]) -> None:
    jobs_validator().validate(job)
    decoded = contract.decode_job(json.dumps(job).encode())
    assert decoded.dataset == job["dataset"]
    if "generation" in job:
        assert decoded.generation.max_tokens == job["generation"]["max_tokens"]


@pytest.mark.parametrize(
    ("job", "field", "words"),
    [
        (
            {"dataset": "q.jsonl", "generation": {"max_token": 64}},
            "generation.max_token",
            "did you mean 'max_tokens'",
        ),
        ({"dataset": "q.jsonl", "max_tokens": 64}, "max_tokens", "belongs in 'generation'"),
        ({"datset": "q.jsonl"}, "datset", "did you mean 'dataset'"),
        ({"dataset": "q.jsonl", "retry": {"attempts": 2}}, "retry.attempts", "unknown field 'attempts'"),
        (
            {"dataset": "q.jsonl", "generation": {"max_tokens": "64"}},
            "generation.max_tokens",
            "Expected `int`",
        ),
        ({"dataset": 7}, "dataset", "Expected `str`"),
        ({}, "(job)", "missing required field `dataset`"),
        ({"dataset": "q.jsonl", "schema_version": SCHEMA_VERSION + 1}, "schema_version", "newer"),
    ],
)
def test_bad_jobs_are_rejected_with_the_field_named(job: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(contract.JobRejected) as caught:
        contract.decode_job(json.dumps(job).encode())
    fields = [f for f, _ in caught.value.problems]
    assert field in fields
    assert words in dict(caught.value.problems)[field]
    if job.get("schema_version", SCHEMA_VERSION) == SCHEMA_VERSION:  # the schema says so too
        assert not jobs_validator().is_valid(job)


def test_a_rejected_job_keeps_a_usable_run_id_only() -> None:
    def run_id_of(run_id: Any) -> str | None:
        with pytest.raises(contract.JobRejected) as caught:
            contract.decode_job(json.dumps({"dataset": "q", "oops": 1, "run_id": run_id}).encode())
        return caught.value.run_id

    assert run_id_of("run-20261201-abc") == "run-20261201-abc"
    assert run_id_of("../../etc") is None
    assert run_id_of("x" * 500) is None
    assert run_id_of(5) is None


def test_garbage_is_not_a_job() -> None:
    for raw in (b"\xff\xfe", b"[1, 2]", b'"a job"', b"null"):
        with pytest.raises(msgspec.DecodeError):
            contract.decode_job(raw)


def test_unknown_fields_are_bounded() -> None:
    job = {"dataset": "q", **{f"f{i}": i for i in range(10_000)}}
    with pytest.raises(contract.JobRejected) as caught:
        contract.decode_job(json.dumps(job).encode())
    assert len(caught.value.problems) == contract.MAX_PROBLEMS


def test_messages_the_services_publish_stay_open() -> None:
    """A newer aggregator may meet results carrying fields it does not know: they decode."""
    result = ShardResult(
        run_id="r",
        shard_id="s",
        worker_id="w",
        group="g",
        results=[
            ItemResult(
                run_id="r", item_id="1", shard_id="s", response="a", extracted="a", correct=True, score=1.0
            )
        ],
    )
    body = json.loads(encode(result))
    jsonschema.Draft202012Validator(
        json.loads((DOCS / "schemas/eval.results.schema.json").read_text())
    ).validate({**body, "added_later": 1})
    assert msgspec.json.decode(json.dumps({**body, "added_later": 1}), type=ShardResult) == result
