"""The fleet view and the routing decision: heartbeat expiry, lag accounting, back-pressure."""

from __future__ import annotations

import pytest

from evalstream.common.messages import GenerationParams, Heartbeat, Item, Shard
from evalstream.common.settings import Settings
from evalstream.router.fleet import Fleet
from evalstream.router.routing import Blocked, Placement, Router, RouterConfig

NOW = 2_000_000.0


def beat(
    group: str, worker: str, ts: float = NOW, status: str = "ready", model: str = "null", **kw: object
) -> Heartbeat:
    return Heartbeat(worker_id=worker, group=group, model=model, ts=ts, device="cpu", status=status, **kw)  # type: ignore[arg-type]


def shard(model: str = "null", pinned: str | None = None) -> Shard:
    return Shard(
        run_id="r",
        shard_id="s",
        shard_index=0,
        shard_count=1,
        model=model,
        grader="auto",
        generation=GenerationParams(),
        items=[Item(id="1", question="q")],
        worker_group=pinned,
    )


def test_a_group_without_heartbeats_for_the_timeout_gets_nothing() -> None:
    fleet = Fleet(heartbeat_timeout_s=10)
    fleet.observe(beat("a", "a-1", ts=NOW - 9))
    fleet.observe(beat("b", "b-1", ts=NOW - 11))
    assert [g.name for g in fleet.eligible("null", now=NOW)] == ["a"]
    assert [g.name for g in fleet.eligible("null", now=NOW + 1.5)] == []
    assert fleet.known("null")  # dead, not forgotten: its shards wait rather than dead-letter
    assert fleet.dead_for(fleet.groups["b"], NOW) == pytest.approx(1.0)
    assert fleet.dead_for(fleet.groups["a"], NOW) is None
    assert fleet.health(fleet.groups["b"], NOW) == "dead"


def test_one_live_member_keeps_a_group_degraded_but_eligible() -> None:
    fleet = Fleet(heartbeat_timeout_s=10)
    fleet.observe(beat("a", "a-1", ts=NOW - 30))
    fleet.observe(beat("a", "a-2", ts=NOW))
    assert fleet.health(fleet.groups["a"], NOW) == "degraded"
    assert fleet.views("null", None, NOW)[0].members == 1
    fleet.observe(beat("a", "a-2", ts=NOW + 1, status="stopped"))  # a clean stop counts at once
    assert fleet.eligible("null", now=NOW + 1) == []


def test_router_routes_nothing_to_an_expired_group() -> None:
    router = Router(RouterConfig(heartbeat_timeout_s=5))
    router.observe(beat("a", "a-1", ts=NOW))
    router.observe(beat("b", "b-1", ts=NOW - 3))
    late = NOW + 2.5  # b's heartbeat is 5.5 s old now
    assert {router.decide(shard(), late).group for _ in range(6)} == {"a"}  # type: ignore[union-attr]
    assert router.decide(shard(), NOW + 6) is Blocked.NO_GROUP


def test_only_admitted_groups_are_seen() -> None:
    fleet = Fleet(groups="bench-*, x")
    assert fleet.observe(beat("bench-1", "w1"))
    assert fleet.observe(beat("x", "w2"))
    assert not fleet.observe(beat("default", "w3"))
    assert sorted(fleet.groups) == ["bench-1", "x"]


def test_outstanding_counts_routed_shards_until_the_next_lag_read() -> None:
    fleet = Fleet()
    fleet.observe(beat("a", "a-1"))
    g = fleet.groups["a"]
    g.routed += 3
    assert g.outstanding == 3
    snapshot = g.routed  # a read starts ...
    g.routed += 2  # ... two more go out while it runs ...
    g.record_lag(4, snapshot, NOW)  # ... and it saw 4 waiting (one of the first 3 done)
    assert g.outstanding == 4 + 2
    assert g.drain_rate is None  # no earlier backlog to compare with


def test_drain_rate_comes_from_backlogged_intervals_only() -> None:
    fleet = Fleet()
    fleet.observe(beat("a", "a-1"))
    g = fleet.groups["a"]
    g.record_lag(10, 0, NOW)
    g.routed = 5
    g.record_lag(9, 5, NOW + 2)  # 10 + 5 routed - 9 left = 6 done in 2 s
    assert g.drain_rate == pytest.approx(3.0)
    g.record_lag(0, 5, NOW + 4)  # drained: an idle stretch says nothing about capacity
    assert g.drain_rate == pytest.approx(3.0)
    g.record_lag(8, 20, NOW + 5)
    g.record_lag(4, 20, NOW + 6)  # 4 done in 1 s: smoothed 0.7·3 + 0.3·4
    assert g.drain_rate == pytest.approx(3.3)


def test_back_pressure_when_every_group_is_saturated() -> None:
    router = Router(RouterConfig(max_lag=2))
    router.observe(beat("a", "a-1"))
    router.observe(beat("b", "b-1"))
    placed = [router.decide(shard(), NOW) for _ in range(4)]
    assert sorted(p.group for p in placed if isinstance(p, Placement)) == ["a", "a", "b", "b"]
    assert router.decide(shard(), NOW) is Blocked.SATURATED
    # a lag read shows b drained one shard: exactly one more fits, then it waits again
    b = router.fleet.groups["b"]
    b.record_lag(1, b.routed, NOW + 1)
    assert router.decide(shard(), NOW + 1) == Placement("b", "null")
    assert router.decide(shard(), NOW + 1) is Blocked.SATURATED
    # a second live member doubles the group's room
    router.observe(beat("a", "a-2", ts=NOW + 1))
    assert router.decide(shard(), NOW + 1) == Placement("a", "null")


def test_round_robin_router_still_stops_when_all_are_full() -> None:
    router = Router(RouterConfig(policy="round_robin", max_lag=3))
    router.observe(beat("a", "a-1"))
    router.observe(beat("b", "b-1"))
    groups = [router.decide(shard(), NOW) for _ in range(6)]
    assert [p.group for p in groups if isinstance(p, Placement)] == ["a", "b"] * 3
    assert router.decide(shard(), NOW) is Blocked.SATURATED


def test_pinned_shards_go_to_their_group_only() -> None:
    router = Router(RouterConfig(max_lag=1))
    router.observe(beat("a", "a-1"))
    router.observe(beat("b", "b-1"))
    assert router.decide(shard(pinned="b"), NOW) == Placement("b", "null")
    assert router.decide(shard(pinned="b"), NOW) is Blocked.SATURATED  # a has room, but it is pinned


def test_heartbeat_metrics_reach_the_view() -> None:
    fleet = Fleet(max_lag=4)
    fleet.observe(
        beat(
            "a",
            "a-1",
            gpu_utilization=0.5,
            gpu_memory_used_bytes=30,
            gpu_memory_free_bytes=10,
            latency_p95_ms=100,
        )
    )
    fleet.observe(beat("a", "a-2", cpu_utilization=0.3, latency_p95_ms=300))
    (v,) = fleet.views("null", None, NOW)
    assert (v.members, v.capacity, v.p95_ms) == (2, 8, 200)
    assert v.utilization == pytest.approx(0.4)
    assert v.memory_pressure == pytest.approx(0.75)


def test_config_from_settings_refuses_bad_values() -> None:
    base = Settings()
    assert RouterConfig.from_settings(base).policy == "weighted"
    for bad in (
        {"router_policy": "fastest"},
        {"router_weights": "lag=0"},
        {"router_max_lag": 0},
        {"router_sla_tiers": "0.9,0.1"},
        {"router_fallback": "hf:big"},
    ):
        with pytest.raises(ValueError):
            RouterConfig.from_settings(Settings(**bad))


def test_evalctl_workers_row_judges_groups_as_the_router_does() -> None:
    from evalstream.cli.workers import worker_group_row

    beats = [
        beat("a", "a-1", ts=NOW - 1, gpu_utilization=0.6, latency_p95_ms=300),
        beat("a", "a-2", ts=NOW - 30, gpu_utilization=0.0),
    ]
    a = worker_group_row(beats, {0: 1, 1: 2}, NOW, timeout_s=10, max_lag=2)
    assert (a["health"], a["healthy"], a["lag"], a["saturated"]) == ("degraded", 1, 3, True)
    assert a["gpu_utilization"] == 0.6 and a["p95_ms"] == 300  # stale members don't count
    assert [m["status"] for m in a["members"]] == ["ready", "stale"]
    assert a["lag_by_partition"] == {"0": 1, "1": 2}
    # the same members judged by the router's fleet
    fleet = Fleet(heartbeat_timeout_s=10, max_lag=2)
    for hb in beats:
        fleet.observe(hb)
    fleet.groups["a"].record_lag(3, 0, NOW)
    view = fleet.views("null", None, NOW)[0]
    assert (fleet.health(fleet.groups["a"], NOW), view.members, view.saturated) == ("degraded", 1, True)
    b = worker_group_row([beat("b", "b-1", ts=NOW - 30)], {}, NOW, timeout_s=10, max_lag=2)
    assert (b["health"], b["lag"], b["saturated"], b["p95_ms"]) == ("dead", 0, None, None)
    gone = worker_group_row([beat("c", "c-1", status="stopped")], {}, NOW, timeout_s=10, max_lag=2)
    assert (gone["health"], gone["members"]) == ("dead", [])


def test_evalctl_workers_says_when_members_wait_for_lack_of_partitions() -> None:
    from evalstream.cli.workers import worker_group_row

    beats = [beat("a", f"a-{i}", ts=NOW - 1) for i in range(8)]
    six = {p: 0 for p in range(6)}
    row = worker_group_row(beats, six, NOW, timeout_s=10, max_lag=2)
    assert (row["partitions"], row["idle_members"]) == (6, 2)
    assert worker_group_row(beats[:6], six, NOW, timeout_s=10, max_lag=2)["idle_members"] == 0
    # stale members are not counted as idle: they do nothing anyway
    stale = [*beats[:6], beat("a", "a-9", ts=NOW - 60)]
    assert worker_group_row(stale, six, NOW, timeout_s=10, max_lag=2)["idle_members"] == 0
