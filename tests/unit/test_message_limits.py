"""Every message we build fits Kafka's limit, retries wait a bounded time, and rows are
storable: the guards that keep a partition from looping on one bad message."""

from __future__ import annotations

import msgspec
import pytest

from evalstream.aggregator.store import Sourced, _one_per_item, storable
from evalstream.common.messages import (
    MESSAGE_BUDGET_BYTES,
    GenerationParams,
    Item,
    ItemResult,
    RetryPolicy,
    ShardResult,
    encode,
)
from evalstream.producer.sharding import plan_chunks
from evalstream.worker.engines.base import GenRequest, TransientEngineError
from evalstream.worker.publishing import result_messages
from evalstream.worker.runner import ModelRunner


def long_items(n: int, size: int) -> list[Item]:
    return [Item(id=f"i{k}", question="x" * size, answer="1") for k in range(n)]


def test_shards_are_cut_by_size_as_well_as_count() -> None:
    items = long_items(40, 40_000)  # 32 of them would be 1.28 MB
    sizes = [len(encode(i)) for i in items]
    chunks = plan_chunks(sizes, max_items=32, max_bytes=MESSAGE_BUDGET_BYTES)
    assert sum(chunks) == len(items) and chunks == [22, 18]
    assert sum(sizes[:22]) <= MESSAGE_BUDGET_BYTES and sum(sizes[22:]) <= MESSAGE_BUDGET_BYTES
    small = [len(encode(i)) for i in long_items(70, 10)]
    assert plan_chunks(small, 32, MESSAGE_BUDGET_BYTES) == [32, 32, 6]


def result(i: int, size: int) -> ItemResult:
    return ItemResult(
        run_id="r",
        item_id=f"i{i}",
        shard_id="s",
        response="y" * size,
        extracted=None,
        correct=False,
        score=0.0,
    )


def test_large_shard_results_are_split_into_messages_that_fit() -> None:
    payload = ShardResult(
        run_id="r", shard_id="s", worker_id="w", group="g", results=[result(i, 30_000) for i in range(100)]
    )
    messages = result_messages(payload)
    assert len(messages) > 1 and all(len(m) <= MESSAGE_BUDGET_BYTES for m in messages)
    from evalstream.common.messages import decode

    ids = [r.item_id for m in messages for r in decode(m, ShardResult).results]
    assert ids == [f"i{i}" for i in range(100)]
    huge = ShardResult(run_id="r", shard_id="s", worker_id="w", group="g", results=[result(0, 2_000_000)])
    [one] = result_messages(huge)
    assert len(one) <= MESSAGE_BUDGET_BYTES and b"truncated to fit a message" in one


def test_retry_delays_are_capped_and_validated() -> None:
    policy = RetryPolicy(max_attempts=20, base_delay_s=1.0, multiplier=4.0, max_delay_s=60.0)
    assert [policy.delay_after(a) for a in (1, 2, 3, 4, 19)] == [1.0, 4.0, 16.0, 60.0, 60.0]
    assert RetryPolicy(multiplier=0.5).problems() and RetryPolicy(base_delay_s=-1).problems()
    assert RetryPolicy().problems() == []


def test_one_row_per_item_in_a_batch_prefers_the_success() -> None:
    failed = ItemResult(
        run_id="r",
        item_id="a",
        shard_id="s",
        response=None,
        extracted=None,
        correct=None,
        score=0.0,
        error="boom",
    )
    ok = result(0, 1)
    ok = ItemResult(**{**{f: getattr(ok, f) for f in ok.__struct_fields__}, "item_id": "a"})
    rows = [Sourced(failed, "t:0:1"), Sourced(ok, "t:0:2"), Sourced(failed, "t:0:3")]
    assert [r.result for r in _one_per_item(rows)] == [ok]
    assert storable("a\x00b") == "a\ufffdb" and storable(3) == 3


class Raising:
    name, revision, device, cacheable = "boom", "1", "cpu", False

    def generate(self, requests: list[GenRequest]) -> list[object]:
        raise RuntimeError("CUDA error: device-side assert")


class Short(Raising):
    def generate(self, requests: list[GenRequest]) -> list[object]:
        return []


@pytest.mark.parametrize("engine", [Raising(), Short()])
def test_an_engine_that_breaks_fails_its_requests_transiently(engine: Raising) -> None:
    requests = [GenRequest(item_id=f"i{i}", messages=[], params=GenerationParams()) for i in range(3)]
    outputs = ModelRunner._generate(engine, requests)  # type: ignore[arg-type]
    assert len(outputs) == 3 and all(isinstance(o, TransientEngineError) for o in outputs)


def test_a_fixed_schema_refuses_deep_nesting_without_the_depth_scan() -> None:
    """ShardResult keeps no value of any shape, so decode skips the byte scan for depth: a
    deep value where a string belongs is a ValidationError at once, a deep unknown field is
    skipped up to the recursion limit and refused past it; a Shard (item meta is any JSON)
    is still scanned. Every refusal is a msgspec error, which a consumer dead-letters."""
    from evalstream.common.messages import Shard, ShardResult, decode, holds_any_shape

    assert holds_any_shape(Shard) and not holds_any_shape(ShardResult)
    head = b'{"run_id":"r","shard_id":"s","worker_id":"w","group":"g","results":[],'
    assert decode(head + b'"junk":' + b"[" * 40 + b"]" * 40 + b"}", ShardResult).run_id == "r"
    for raw in (
        head + b'"junk":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"run_id":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        head + b'"junk":"' + b"x" * 1_100_000 + b'"}',
    ):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            decode(raw, ShardResult)
    deep_meta = b'{"id":"a","question":"q","meta":{"x":' + b"[" * 40 + b"]" * 40 + b"}}"
    shard = (
        b'{"run_id":"r","shard_id":"s","shard_index":0,"shard_count":1,"model":"null",'
        b'"grader":"exact","generation":{},"items":[' + deep_meta + b"]}"
    )
    with pytest.raises(msgspec.DecodeError, match="nested deeper than 32"):
        decode(shard, Shard)
