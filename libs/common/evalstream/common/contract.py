"""The public message contract: what any Kafka client may publish to eval.jobs and what it
reads from eval.results and eval.dlq.

The JSON Schemas and the AsyncAPI document in docs/ are generated from the msgspec types
in messages.py (`python -m evalstream.common.contract docs` rewrites them; a unit test
regenerates and compares, so they cannot drift from the code).

Jobs are a *closed* contract: a field the job types do not have (`max_token` for
`max_tokens`) rejects the run with the field named, instead of being ignored while the run
goes ahead with defaults. Messages the services publish to each other stay open (unknown
fields are ignored), so that a newer publisher can add a field without breaking an older
consumer during a rolling upgrade. Evolution rules (schema_version) are in docs/contract.md.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from evalstream.common.jsonlimits import has_nul, shape_problem
from evalstream.common.messages import SCHEMA_VERSION, DeadLetterHeaders, JobSpec, Shard, ShardResult
from evalstream.common.names import is_plain_name

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
MAX_PROBLEMS = 50  # a job with thousands of unknown fields is reported by its first ones
# A job envelope is at most 64 KiB (intake_limits.MAX_JOB_BYTES); a message far beyond that
# is not parsed at all.
MAX_JOB_MESSAGE_BYTES = 256 * 1024


class PublicTopic(msgspec.Struct, frozen=True):
    name: str  # without KAFKA_TOPIC_PREFIX
    message: type[msgspec.Struct]
    closed: bool  # unknown fields rejected (jobs) or ignored (everything the services publish)
    key: str
    description: str


PUBLIC_TOPICS = (
    PublicTopic(
        "eval.jobs",
        JobSpec,
        closed=True,
        key="the run id (any key, or none, is accepted: jobs are independent)",
        description=(
            "Evaluation jobs, published by `evalctl submit` or any Kafka client. The producer "
            "validates the job and its whole dataset before publishing anything; a job with an "
            "unknown field, a wrong type, a bad value or a bad dataset is recorded as a run with "
            "status `rejected` and its problems, and nothing of it is published. A message that "
            "is not a JSON object becomes a dead letter on eval.dlq."
        ),
    ),
    PublicTopic(
        "eval.results",
        ShardResult,
        closed=False,
        key="`<run id>#<shard index>`: the shard's key, which spreads a run over the partitions",
        description=(
            "The items of one shard delivery that reached an outcome (an answer, or an error "
            "after the last attempt). Delivery is at-least-once: a result may arrive twice; "
            "`(run_id, item_id)` is its natural key."
        ),
    ),
    PublicTopic(
        "eval.dlq",
        Shard,
        closed=False,
        key="`<run id>#<shard index>` (a failed item's shard), or the original message's key",
        description=(
            "Dead letters. When the header `x-error-type` is `ItemFailed` the value is a Shard "
            "holding only the item that failed every attempt; otherwise the value is the "
            "original message's bytes, unchanged (possibly not JSON), from the topic named in "
            "`x-original-topic`. `evalctl dlq redrive` puts failed items back."
        ),
    ),
)

DLQ_HEADERS: dict[str, str] = {
    DeadLetterHeaders.ORIGINAL_TOPIC: "topic the message was taken from",
    DeadLetterHeaders.ORIGINAL_PARTITION: "its partition (decimal)",
    DeadLetterHeaders.ORIGINAL_OFFSET: "its offset (decimal)",
    DeadLetterHeaders.ERROR: "why it died (at most 2,000 characters)",
    DeadLetterHeaders.ERROR_TYPE: "exception class name, or ItemFailed for an item out of attempts",
    DeadLetterHeaders.ATTEMPTS: "attempts made (decimal)",
    DeadLetterHeaders.RUN_ID: "run of the failed item",
    DeadLetterHeaders.ITEM_ID: "the failed item",
    DeadLetterHeaders.FAILED_AT: "unix time of the failure (decimal seconds)",
}


# --- the closed job contract ------------------------------------------------------------


class JobRejected(Exception):
    """A JSON object on eval.jobs that is not a valid job. `problems` are (field path,
    message) pairs; `run_id` is the job's own run_id when it names a usable one."""

    def __init__(self, problems: list[tuple[str, str]], run_id: str | None, job: dict[str, Any]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = problems
        self.run_id = run_id
        self.job = job


def _struct_types(annotation: Any) -> list[type[msgspec.Struct]]:
    """The Struct types a field's value may be (`GenerationParams`, `X | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _struct_types(arg)]
    return []


def unknown_fields(
    value: dict[str, Any], kind: type[msgspec.Struct], path: str = ""
) -> list[tuple[str, str]]:
    """(path, message) for every key of `value`, at any depth, that `kind` does not have,
    with the nearest known name when one is close (`max_token` -> `max_tokens`)."""
    fields = {f.encode_name: f for f in msgspec.structs.fields(kind)}
    out: list[tuple[str, str]] = []
    for key, sub in value.items():
        where = f"{path}{key}"
        field = fields.get(key)
        if field is None:
            hint = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.7)
            guess = f" (did you mean {hint[0]!r}?)" if hint else ""
            if not hint and (home := _nested_home(kind, key)):
                guess = f" ({key!r} belongs in {home!r})"
            scope = f"in {path[:-1]!r}" if path else "in a job"
            known = ", ".join(sorted(fields))
            out.append((where, f"unknown field {key!r} {scope}{guess}; known fields: {known}"))
        elif isinstance(sub, dict):
            for struct in _struct_types(field.type):
                out += unknown_fields(sub, struct, f"{where}.")
                break
        if len(out) >= MAX_PROBLEMS:
            break
    return out[:MAX_PROBLEMS]


def _nested_home(kind: type[msgspec.Struct], key: str) -> str | None:
    """The field of `kind` whose own fields include `key` (`max_tokens` -> `generation`)."""
    for field in msgspec.structs.fields(kind):
        for struct in _struct_types(field.type):
            if key in {f.encode_name for f in msgspec.structs.fields(struct)}:
                return field.encode_name
    return None


_AT = re.compile(r" - at `\$\.?(.*)`$")


def _validation_problem(exc: msgspec.ValidationError) -> tuple[str, str]:
    """msgspec's "Expected `int`, got `str` - at `$.generation.max_tokens`" as (field, message)."""
    text = str(exc)
    m = _AT.search(text)
    return (m.group(1) or "(job)", text[: m.start()]) if m else ("(job)", text)


def decode_job(raw: bytes) -> JobSpec:
    """The job in `raw`, checked against the closed job contract.

    Raises msgspec.DecodeError when `raw` is not a JSON object at all (garbage: a dead
    letter), JobRejected when it is an object but not a valid job (a rejected run). Bytes
    too large or too deeply nested to parse are garbage too (jsonlimits: checked first)."""
    if problem := shape_problem(raw, MAX_JOB_MESSAGE_BYTES):
        raise msgspec.DecodeError(f"not decoded: {problem}")
    obj = msgspec.json.decode(raw)
    if not isinstance(obj, dict):
        raise msgspec.DecodeError(f"a job is a JSON object, got {type(obj).__name__}")
    named = obj.get("run_id")
    # a rejected job's run keeps the job's own run_id only when that is a plain name (names.py);
    # else it is named after the message's place in Kafka
    run_id = named if isinstance(named, str) and is_plain_name(named) else None
    problems = unknown_fields(obj, JobSpec)
    if has_nul(raw):  # PostgreSQL stores no NUL: the run is rejected, its record cleaned of them
        problems.insert(0, ("job", "a field or key holds a NUL character (\\u0000)"))
    version = obj.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        problems.append(
            (
                "schema_version",
                f"schema_version {version} is newer than this producer understands ({SCHEMA_VERSION})",
            )
        )
    if not problems:
        try:
            return msgspec.convert(obj, JobSpec)
        except msgspec.ValidationError as exc:
            problems.append(_validation_problem(exc))
    raise JobRejected(problems, run_id, obj)


# --- generated documents ----------------------------------------------------------------


def _close_objects(schema: dict[str, Any]) -> None:
    for definition in schema.get("$defs", {}).values():
        if definition.get("type") == "object":
            definition["additionalProperties"] = False


def topic_schema(topic: PublicTopic) -> dict[str, Any]:
    """The JSON Schema of a topic's message value, generated from its msgspec type."""
    body = msgspec.json.schema(topic.message)
    if topic.closed:
        _close_objects(body)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:evalstream:schema:{topic.name}",
        "title": f"{topic.name} message (schema_version {SCHEMA_VERSION})",
        "description": topic.description,
        **body,
    }


def dlq_headers_schema() -> dict[str, Any]:
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": "urn:evalstream:schema:eval.dlq.headers",
        "title": "eval.dlq headers (UTF-8 strings)",
        "type": "object",
        "properties": {name: {"type": "string", "description": d} for name, d in DLQ_HEADERS.items()},
        "required": [DeadLetterHeaders.ERROR, DeadLetterHeaders.ERROR_TYPE, DeadLetterHeaders.ATTEMPTS],
    }


def schema_file(topic_name: str) -> str:
    return f"schemas/{topic_name}.schema.json"


def asyncapi() -> dict[str, Any]:
    """AsyncAPI 3.0 description of the public topics; payloads refer to the schema files."""
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for topic in PUBLIC_TOPICS:
        channel = topic.name.removeprefix("eval.")
        message = topic.message.__name__
        messages[message] = {
            "name": message,
            "contentType": "application/json",
            "payload": {"$ref": f"./{schema_file(topic.name)}"},
            "bindings": {"kafka": {"key": {"type": "string", "description": topic.key}}},
        }
        if topic.name == "eval.dlq":
            messages[message]["headers"] = {"$ref": f"./{schema_file('eval.dlq.headers')}"}
        channels[channel] = {
            "address": topic.name,
            "description": topic.description,
            "messages": {message: {"$ref": f"#/components/messages/{message}"}},
        }
        action = "send" if topic.name == "eval.jobs" else "receive"
        operations[f"{action}{channel.capitalize()}"] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{message}"}],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "evalstream public topics",
            "version": str(SCHEMA_VERSION),
            "description": (
                "JSON messages on Apache Kafka. Topic names take the operator's "
                "KAFKA_TOPIC_PREFIX (default empty). Evolution rules: docs/contract.md."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "127.0.0.1:9092",
                "protocol": "kafka",
                "description": "the local stack (`make up`); KAFKA_BOOTSTRAP elsewhere",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def documents() -> dict[str, str]:
    """Every generated file under docs/, by relative path, as its exact text."""

    def as_json(value: Any) -> str:
        return json.dumps(value, indent=2, ensure_ascii=False) + "\n"

    out = {schema_file(t.name): as_json(topic_schema(t)) for t in PUBLIC_TOPICS}
    out[schema_file("eval.dlq.headers")] = as_json(dlq_headers_schema())
    out["asyncapi.json"] = as_json(asyncapi())
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m evalstream.common.contract DOCS_DIR  (rewrites the generated contract files)")
        return 2
    root = Path(argv[0])
    for name, text in documents().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
