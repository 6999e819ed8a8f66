"""Idempotency and cache keys. Deterministic: the same inputs give the same key on any
machine, in any process, so that redelivered or replayed work lands on the same row."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def _sha(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\x00")
    return h.hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def run_id_for_message(topic: str, partition: int, offset: int) -> str:
    """A job published without a run_id gets one derived from where it sits in Kafka, so
    redelivering the same job message never starts a second run."""
    return "run-" + _sha("job", topic, str(partition), str(offset))[:16]


def shard_id(run_id: str, index: int) -> str:
    return f"{run_id}-s{index:05d}"


def item_key(run_id: str, item_id: str) -> str:
    """The natural key of a result, as one string (Kafka keys, object names)."""
    return f"{run_id}/{item_id}"


def cache_key(*, model: str, model_revision: str, generation: Any, prompt: str) -> str:
    """Everything that determines an answer: model and its weights, generation parameters,
    the rendered prompt. Anything else (run, item id, grader) must not change it."""
    return _sha("answer", model, model_revision, canonical_json(generation), prompt)


def shard_object_name(run_id: str, shard_id: str) -> str:
    """Deterministic S3 name of a shard's results (rewriting it is idempotent)."""
    return f"runs/{run_id}/results/{shard_id}.parquet"
