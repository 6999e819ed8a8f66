"""What the aggregator puts back when a run's dead letters are redriven (aggregator/redrive.py)."""

from __future__ import annotations

from evalstream.aggregator.redrive import fresh_shards, redriven
from evalstream.common.messages import GenerationParams, Item, RetryPolicy, Shard, encode


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


def parked_shard() -> Shard:
    """A shard the router parked for an hour, then dead-lettered as unroutable."""
    return Shard(
        run_id="r",
        shard_id="r-s00001",
        shard_index=1,
        shard_count=3,
        model="m",
        grader="exact",
        generation=GenerationParams(),
        items=[Item(id="a", question="q"), Item(id="b", question="q")],
        retry=RetryPolicy(max_attempts=4),
        attempt=4,
        not_before=1e12,
        parked_at=1_700_000_000.0,
        worker_group="g",
        routed_to="g",
        served_model="m-small",
        sla_fallback=True,
    )


def test_a_redriven_shard_starts_afresh_and_is_not_parked() -> None:
    fresh = redriven(parked_shard(), [Item(id="b", question="q")])
    assert [i.id for i in fresh.items] == ["b"]
    assert (fresh.attempt, fresh.not_before, fresh.parked_at) == (1, 0.0, 0.0)
    assert fresh.routed_to is None and fresh.served_model is None
    # what the job asked for stays
    assert (fresh.worker_group, fresh.sla_fallback, fresh.retry.max_attempts) == ("g", True, 4)
    assert (fresh.run_id, fresh.shard_id, fresh.shard_count) == ("r", "r-s00001", 3)
