"""The routing policies (router/policy.py): pure functions, checked on hand-computed values."""

from __future__ import annotations

import math

import pytest

from evalstream.common.messages import GenerationParams, Item, Shard
from evalstream.router import policy
from evalstream.router.policy import GroupView, ShardTraits

EQUAL = {"lag": 0.25, "latency": 0.25, "gpu": 0.25, "memory": 0.25}
SHORT = ShardTraits(prompt_tokens=10, prefix_key="k")


def view(name: str, outstanding: int = 0, capacity: int = 10, **kw: object) -> GroupView:
    return GroupView(name=name, members=1, outstanding=outstanding, capacity=capacity, **kw)  # type: ignore[arg-type]


def name_of(v: GroupView | None) -> str:
    assert v is not None
    return v.name


def shard(questions: list[str], system: str | None = None, model: str = "null") -> Shard:
    return Shard(
        run_id="r",
        shard_id="s",
        shard_index=0,
        shard_count=1,
        model=model,
        grader="auto",
        generation=GenerationParams(),
        items=[Item(id=str(i), question=q) for i, q in enumerate(questions)],
        system_prompt=system,
    )


def test_parse_weights_normalises_and_rejects_nonsense() -> None:
    assert policy.parse_weights("lag=2,latency=1,gpu=1") == {
        "lag": 0.5,
        "latency": 0.25,
        "gpu": 0.25,
        "memory": 0.0,
    }
    for bad in ("speed=1", "lag=-1", "lag=0", "lag"):
        with pytest.raises(ValueError):
            policy.parse_weights(bad)


def test_weighted_score_is_the_documented_sum() -> None:
    v = view("a", outstanding=5, capacity=10, p95_ms=200, utilization=0.4, memory_pressure=0.5)
    # L = 0.5, P = 200/400, U = 0.4, M·π = 0.5 · (1024/2048)
    score = policy.weighted_score(v, EQUAL, max_p95_ms=400, prompt_tokens=1024)
    assert score == pytest.approx(0.25 * (0.5 + 0.5 + 0.4 + 0.25))


def test_weighted_prefers_the_less_loaded_and_the_faster_group() -> None:
    busy, idle = view("busy", outstanding=8), view("idle", outstanding=1)
    assert policy.pick_weighted([busy, idle], EQUAL, 10) == idle
    slow, fast = view("slow", outstanding=2, p95_ms=800), view("fast", outstanding=2, p95_ms=200)
    assert policy.pick_weighted([slow, fast], EQUAL, 10) == fast
    # lag outweighs latency once the fast group's queue is much longer
    fuller = view("fast", outstanding=9, p95_ms=200)
    assert policy.pick_weighted([slow, fuller], {"lag": 0.8, "latency": 0.2}, 10) == slow


def test_all_saturated_means_wait_for_every_policy() -> None:
    full, fuller = view("full", outstanding=10), view("fuller", outstanding=12)
    assert full.saturated and fuller.saturated
    for name in policy.POLICIES:
        assert policy.choose(name, [full, fuller], SHORT, weights=EQUAL) is None
        assert policy.choose(name, [], SHORT, weights=EQUAL) is None


def test_a_saturated_best_group_is_waited_for_unless_another_is_idle() -> None:
    fast_full = view("fast", outstanding=10, p95_ms=100, drain_rate=10.0)  # done in 1.1 s
    slow_busy = view("slow", outstanding=2, p95_ms=400, drain_rate=1.0)  # done in 3 s
    slow_idle = view("slow", outstanding=0, p95_ms=400, drain_rate=1.0)  # done in 1 s
    weights = {"lag": 0.4, "latency": 0.6}
    assert policy.pick_least_outstanding([fast_full, slow_busy]) is None
    assert policy.pick_weighted([fast_full, slow_busy], weights, 10) is None
    # an idle group always gets work (and for least_outstanding it is the quicker one here)
    assert policy.pick_least_outstanding([fast_full, slow_idle]) == slow_idle
    assert policy.pick_weighted([fast_full, slow_idle], weights, 10) == slow_idle
    # consistent hashing spills to the next group (bounded loads); round robin ignores load
    assert policy.choose("consistent_hash", [fast_full, slow_busy], SHORT, weights=EQUAL) == slow_busy
    picks = {policy.pick_round_robin([fast_full, slow_busy], t) for t in range(2)}
    assert picks == {fast_full, slow_busy}


def test_prompt_length_brings_memory_pressure_into_play() -> None:
    tight = view("tight", utilization=0.1, memory_pressure=0.9)
    roomy = view("roomy", utilization=0.5, memory_pressure=0.1)
    assert policy.pick_weighted([tight, roomy], EQUAL, prompt_tokens=0) == tight
    assert policy.pick_weighted([tight, roomy], EQUAL, prompt_tokens=4096) == roomy


def test_entropy_weights_favour_the_term_that_separates_groups() -> None:
    rows = [
        {"lag": 0.0, "latency": 0.5, "gpu": 0.0, "memory": 0.0},
        {"lag": 1.0, "latency": 0.5, "gpu": 0.0, "memory": 0.0},
    ]
    w = policy.entropy_weights(rows, {"lag": 0.5, "latency": 0.5, "gpu": 0.0, "memory": 0.0})
    # lag: entropy 0, divergence 1 -> 0.5·1.1; latency: entropy 1, divergence 0 -> 0.5·0.1
    assert w["lag"] == pytest.approx(0.55 / 0.6)
    assert w["latency"] == pytest.approx(0.05 / 0.6)
    assert w["gpu"] == w["memory"] == 0.0
    assert math.fsum(w.values()) == pytest.approx(1.0)
    # fewer than two rows carry no information: the base weights
    assert policy.entropy_weights(rows[:1], EQUAL) == pytest.approx(EQUAL)


def test_adaptive_weights_forget_what_left_the_window() -> None:
    base = {"lag": 0.5, "latency": 0.5, "gpu": 0.0, "memory": 0.0}
    weights = policy.AdaptiveWeights(base, window_s=60)
    apart = [view("a", outstanding=0, p95_ms=100), view("b", outstanding=10, p95_ms=100)]
    w = weights.observe(0.0, apart)
    assert w["lag"] > 0.9 > 0.1 > w["latency"]
    # a minute later the groups differ in latency only: the weights swing over
    alike = [view("a", outstanding=5, p95_ms=100), view("b", outstanding=5, p95_ms=900)]
    w = weights.observe(61.0, alike)
    assert w["latency"] > w["lag"]
    assert weights.current == w


def test_least_outstanding_weighs_work_by_measured_drain_rate() -> None:
    fast = view("fast", outstanding=6, drain_rate=10.0)  # (6+1)/10 = 0.7 s
    slow = view("slow", outstanding=1, drain_rate=1.0)  # (1+1)/1 = 2 s
    assert policy.pick_least_outstanding([fast, slow]) == fast
    # without a measured rate for every candidate: live members stand in (least connections)
    unknown = view("slow", outstanding=1)
    assert policy.pick_least_outstanding([fast, unknown]) == unknown
    two = GroupView("two", members=2, outstanding=3, capacity=10)  # (3+1)/2 = 2 < (2+1)/1
    assert policy.pick_least_outstanding([two, view("one", outstanding=2)]) == two


def test_consistent_hash_keeps_prefixes_together_and_moves_only_a_lost_groups_keys() -> None:
    groups = [view("g1"), view("g2"), view("g3")]
    keys = [f"null\x00prefix-{i}" for i in range(300)]
    owner = {k: name_of(policy.pick_consistent_hash(groups, k)) for k in keys}
    assert all(name_of(policy.pick_consistent_hash(groups[::-1], k)) == owner[k] for k in keys)
    shares = {g.name: sum(o == g.name for o in owner.values()) for g in groups}
    assert all(40 < n < 180 for n in shares.values()), shares  # 64 virtual nodes spread keys
    # g2 dies: its keys move, nobody else's do
    survivors = [groups[0], groups[2]]
    for k in keys:
        new = name_of(policy.pick_consistent_hash(survivors, k))
        assert new == owner[k] if owner[k] != "g2" else new in ("g1", "g3")
    # a saturated owner passes its keys on clockwise (bounded loads), the others stay
    full = [view("g1", outstanding=10), groups[1], groups[2]]
    for k in keys:
        new = name_of(policy.pick_consistent_hash(full, k))
        assert new == owner[k] if owner[k] != "g1" else new in ("g2", "g3")


def test_shards_sharing_a_prompt_prefix_share_a_key() -> None:
    system = "You are a careful grader. " * 20  # longer than the prefix window
    a = policy.traits(shard(["What is 1+1?"], system))
    b = policy.traits(shard(["Name a colour."], system))
    c = policy.traits(shard(["What is 1+1?"], "Be brief."))
    assert a.prefix_key == b.prefix_key != c.prefix_key
    assert policy.traits(shard(["What is 1+1?"], system, model="hf:x")).prefix_key != a.prefix_key
    # mean over items, 4 characters a token
    t = policy.traits(shard(["x" * 40, "y" * 80]))
    assert t.prompt_tokens == pytest.approx(60 / 4)


def test_round_robin_ignores_load_until_everything_is_full() -> None:
    a, b = view("a", outstanding=10), view("b")
    picks = [policy.pick_round_robin([b, a], turn) for turn in range(4)]
    assert [p.name for p in picks if p] == ["a", "b", "a", "b"]
    assert policy.pick_round_robin([a, view("b", outstanding=10)], 0) is None


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="least_outstanding"):
        policy.check_policy("fastest")
    with pytest.raises(ValueError):
        policy.choose("fastest", [view("a")], SHORT, weights=EQUAL)
