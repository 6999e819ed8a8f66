"""What the aggregator puts back when a run's dead letters are redriven (aggregator/redrive.py)."""

from __future__ import annotations

from evalstream.aggregator.redrive import fresh_shards
from evalstream.common.messages import GenerationParams, Item, Shard, encode


def shard(shard_id: str, ids: list[str], attempt: int = 3) -> Shard:
    return Shard(
        run_id="r", shard_id=shard_id, shard_index=0, shard_count=1, model="null", grader="exact",
        generation=GenerationParams(), items=[Item(id=i, question="q?", answer="a") for i in ids],
        attempt=attempt, not_before=123.0, routed_to="g",
    )  # fmt: skip


def test_each_item_once_with_fresh_attempts_poison_left_alone() -> None:
    letters = [
        (1, encode(shard("s1", ["a", "b"]))),
        (2, b"not a shard"),
        (3, encode(shard("s1", ["b"]))),  # dead-lettered again by a worker that died before committing
        (4, encode(shard("s2", ["c"]))),
    ]
    covered, shards = fresh_shards(letters)
    assert covered == [1, 3, 4]
    assert [(s.shard_id, [i.id for i in s.items]) for s in shards] == [("s1", ["a", "b"]), ("s2", ["c"])]
    assert {(s.attempt, s.not_before, s.routed_to) for s in shards} == {(1, 0.0, None)}
