"""Idempotency and cache keys. Deterministic: the same inputs give the same key on any
machine, in any process, so that redelivered or replayed work lands on the same row."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from evalstream.common.names import plain_name


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


def score_cache_key(*, model: str, model_revision: str, kind: str, context: str, continuation: str) -> str:
    """Everything that determines a log-likelihood score: model and its weights, the kind of
    request ("loglikelihood", or "loglikelihood_rolling/<window>" with the engine's window
    length), the context and the continuation (one JSON array, so that no split of the two
    texts can give another pair's key). Tagged "score": never an answer's key."""
    return _sha("score", kind, model, model_revision, canonical_json([context, continuation]))


def run_object_name(run_id: str, name: str) -> str:
    """The S3 name of one of a run's objects (`runs/<run>/<name>`); ValueError for a run id
    that is no plain name (names.py), whatever let it through before."""
    return f"runs/{plain_name(run_id, 'run id')}/{name}"


def segment_object_name(run_id: str, segment: int) -> str:
    """Deterministic S3 name of a segment of a run's results (rewriting it is idempotent)."""
    return run_object_name(run_id, f"results/part-{segment:06d}.parquet")
