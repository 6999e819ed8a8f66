"""`evalctl dlq redrive` sends a dead letter's items back as a fresh delivery."""

from __future__ import annotations

from evalstream.cli.main import redriven
from evalstream.common.messages import GenerationParams, Item, RetryPolicy, Shard


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
