"""SLA fallback: the violation rate, the tiers, the fallback chain (router/sla.py), the
router's use of them, and the worker serving the model the router chose."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from evalstream.common.messages import GenerationParams, Heartbeat, Item, Shard
from evalstream.router import sla
from evalstream.router.routing import Blocked, Placement, Router, RouterConfig
from evalstream.worker.engines.base import EngineError, GenOutput, GenRequest
from evalstream.worker.engines.null import NullEngine
from evalstream.worker.runner import ModelRunner, RunnerConfig

NOW = 1_000_000.0


def samples(n: int, slow: int, failing: int, ts: float = NOW) -> list[sla.Sample]:
    return [
        sla.Sample(ts, "g", p95_ms=5000 if i < slow else 100, error_rate=0.5 if i < failing else 0.0)
        for i in range(n)
    ]


def test_violation_rate_weighs_latency_07_and_errors_03() -> None:
    assert sla.violation_rate(samples(10, slow=3, failing=5), 1000, 0.05) == pytest.approx(
        0.7 * 0.3 + 0.3 * 0.5
    )
    assert sla.violation_rate(samples(4, slow=4, failing=0), 1000, 0.05) == pytest.approx(0.7)
    assert sla.violation_rate(samples(4, slow=0, failing=4), 1000, 0.05) == pytest.approx(0.3)
    assert sla.violation_rate([], 1000, 0.05) == 0.0
    # the limits are strict: at the limit is no violation
    assert sla.violation_rate([sla.Sample(NOW, "g", 1000, 0.05)], 1000, 0.05) == 0.0


def test_tiers_count_the_thresholds_reached() -> None:
    tiers = sla.parse_tiers("0.3, 0.6")
    assert [sla.tier(r, tiers) for r in (0.0, 0.29, 0.3, 0.59, 0.6, 1.0)] == [0, 0, 1, 1, 2, 2]
    for bad in ("0.6,0.3", "0.3,0.3", "0,0.5", "1.5"):
        with pytest.raises(ValueError):
            sla.parse_tiers(bad)


def test_fallback_chain_and_candidates_per_tier() -> None:
    mapping = sla.parse_fallback("hf:big.gguf=hf:medium.gguf, hf:medium.gguf=hf:small.gguf")
    assert sla.chain("hf:big.gguf", mapping) == ["hf:big.gguf", "hf:medium.gguf", "hf:small.gguf"]
    assert sla.chain("null", mapping) == ["null"]
    assert sla.candidates("hf:big.gguf", mapping, 0) == ["hf:big.gguf", "hf:medium.gguf", "hf:small.gguf"]
    assert sla.candidates("hf:big.gguf", mapping, 1) == ["hf:medium.gguf", "hf:small.gguf", "hf:big.gguf"]
    assert sla.candidates("hf:big.gguf", mapping, 2) == ["hf:small.gguf", "hf:medium.gguf", "hf:big.gguf"]
    assert sla.candidates("hf:big.gguf", mapping, 7) == ["hf:small.gguf", "hf:medium.gguf", "hf:big.gguf"]
    assert sla.candidates("hf:medium.gguf", mapping, 1) == ["hf:small.gguf", "hf:medium.gguf"]
    assert sla.chain("a", {"a": "b", "b": "a"}) == ["a", "b"]  # a cycle ends the chain
    for bad in ("hf:big.gguf", "hf:big.gguf=", "hf:big.gguf=hf:big.gguf", "a=b,a=c"):
        with pytest.raises(ValueError):
            sla.parse_fallback(bad)


def test_window_keeps_60_seconds_of_the_groups_asked_for() -> None:
    window = sla.SlaWindow()
    for s in samples(4, slow=4, failing=0, ts=NOW - 61):  # stale: all violations
        window.add(s)
    for s in samples(4, slow=1, failing=0, ts=NOW - 5):
        window.add(s)
    window.add(sla.Sample(NOW, "other", 9999, 1.0))
    rate = window.rate(lambda g: g == "g", NOW, 1000, 0.05)
    assert rate == pytest.approx(0.7 * 1 / 4)
    assert window.rate(lambda g: False, NOW, 1000, 0.05) == 0.0


# --------------------------------------------------------------------------- in the router


def beat(
    group: str, model: str, p95: float = 100.0, err: float = 0.0, ts: float = NOW, n: int = 0
) -> Heartbeat:
    return Heartbeat(
        worker_id=f"{group}-{n}",
        group=group,
        model=model,
        ts=ts,
        device="cpu",
        latency_p95_ms=p95,
        error_rate=err,
    )


def make_shard(opt_in: bool, pinned: str | None = None) -> Shard:
    return Shard(
        run_id="r",
        shard_id="s",
        shard_index=0,
        shard_count=1,
        model="hf:big.gguf",
        grader="auto",
        generation=GenerationParams(),
        items=[Item(id="1", question="2+2?", answer="4")],
        sla_fallback=opt_in,
        worker_group=pinned,
    )


@pytest.fixture
def router() -> Router:
    return Router(
        RouterConfig(
            sla_p95_ms=1000,
            sla_tiers=(0.3, 0.6),
            fallback=(("hf:big.gguf", "hf:medium.gguf"), ("hf:medium.gguf", "hf:small.gguf")),
        )
    )


def feed(router: Router, big_slow: int, of: int = 10) -> None:
    """`of` heartbeats of the big group over the last seconds, `big_slow` of them too slow."""
    for i in range(of):
        router.observe(beat("big", "hf:big.gguf", p95=5000 if i < big_slow else 100, ts=NOW - of + i))
    router.observe(beat("medium", "hf:medium.gguf"))
    router.observe(beat("small", "hf:small.gguf"))


@pytest.mark.parametrize(
    ("slow", "group", "tier"),
    [(0, "big", 0), (4, "big", 0), (5, "medium", 1), (8, "medium", 1), (9, "small", 2), (10, "small", 2)],
)
def test_opted_in_runs_step_down_a_tier_at_a_time(router: Router, slow: int, group: str, tier: int) -> None:
    feed(router, big_slow=slow)  # rate = 0.7 · slow / 10
    placed = router.decide(make_shard(opt_in=True), NOW)
    assert placed == Placement(group, f"hf:{group}.gguf", tier)


def test_runs_that_dont_opt_in_or_pin_a_group_keep_their_model(router: Router) -> None:
    feed(router, big_slow=10)
    assert router.decide(make_shard(opt_in=False), NOW) == Placement("big", "hf:big.gguf", 0)
    assert router.decide(make_shard(opt_in=True, pinned="big"), NOW) == Placement("big", "hf:big.gguf", 0)


def test_fallback_skips_a_model_without_healthy_groups(router: Router) -> None:
    feed(router, big_slow=10)
    router.observe(beat("small", "hf:small.gguf", ts=NOW - 60))  # small's only member went silent
    assert router.decide(make_shard(opt_in=True), NOW) == Placement("medium", "hf:medium.gguf", 2)
    # a non-opted run whose model has no healthy group waits
    for i in range(10):
        router.observe(beat("big", "hf:big.gguf", ts=NOW - 60, n=i))
    assert router.decide(make_shard(opt_in=False), NOW) is Blocked.NO_GROUP


def test_the_violation_window_is_60_seconds(router: Router) -> None:
    for i in range(10):
        router.observe(beat("big", "hf:big.gguf", p95=5000, ts=NOW - 70 + i))  # a bad minute ago
    router.observe(beat("big", "hf:big.gguf", p95=100, ts=NOW))
    router.observe(beat("medium", "hf:medium.gguf"))
    assert router.decide(make_shard(opt_in=True), NOW) == Placement("big", "hf:big.gguf", 0)


# --------------------------------------------------------------------------- in the worker


class NamedEngine(NullEngine):
    def __init__(self, name: str) -> None:
        self.name = name

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        return [GenOutput(text=f"4 from {self.name}") for _ in requests]


def test_worker_serves_the_routed_model_and_says_so() -> None:
    asked: list[str] = []

    def engine_for(spec: str) -> NamedEngine:
        asked.append(spec)
        return NamedEngine(spec)

    runner = ModelRunner(RunnerConfig(group="light"), engine_for, cache=None)
    fallback = msgspec.structs.replace(
        make_shard(opt_in=True), served_model="hf:small.gguf", routed_to="light"
    )
    plain = msgspec.structs.replace(make_shard(opt_in=False), shard_id="s2")
    outcome = asyncio.run(runner.run([fallback, plain]))
    assert set(asked) == {"hf:small.gguf", "hf:big.gguf"}
    assert [r.served_by for r in outcome.results["s"]] == ["light/hf:small.gguf"]
    assert [r.response for r in outcome.results["s"]] == ["4 from hf:small.gguf"]
    assert [r.served_by for r in outcome.results["s2"]] == ["light/hf:big.gguf"]
