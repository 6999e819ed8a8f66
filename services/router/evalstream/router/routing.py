"""The routing decision for one shard, and the state it needs. No Kafka in here: app.py
consumes and publishes, health.py reads lag and rescues dead groups; both call `Router`.

decide(shard) ->
* a `Placement` (group + the model it will serve) — the shard's share of the group's
  capacity is reserved at once, so that concurrent decisions cannot overfill it;
* SATURATED — every eligible group is saturated: the caller holds the shard and waits for a
  change (back-pressure);
* NO_GROUP — no healthy group serves the model: the caller waits, or gives up.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from evalstream.common.messages import Heartbeat, Shard
from evalstream.common.metrics import ROUTER_POLICY_WEIGHT, ROUTER_SLA_TIER, ROUTER_SLA_VIOLATION
from evalstream.common.settings import RouterSettings
from evalstream.common.tasks import wait_event
from evalstream.router import policy as policies
from evalstream.router import sla
from evalstream.router.fleet import Fleet


class Blocked(enum.Enum):
    SATURATED = "saturated"
    NO_GROUP = "no_group"


@dataclass(frozen=True)
class Placement:
    group: str
    model: str  # what the group serves the shard with; differs from shard.model on fallback
    tier: int = 0  # SLA tier at decision time (0 for runs that don't opt in)


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "weighted"
    weights: policies.Weights | None = None
    heartbeat_timeout_s: float = 15.0
    max_lag: int = 32
    groups: str = "*"
    sla_p95_ms: float = 30_000.0
    sla_max_error_rate: float = 0.05
    sla_tiers: tuple[float, ...] = (0.3, 0.6)
    fallback: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_settings(cls, s: RouterSettings) -> RouterConfig:
        """Raises ValueError on a bad ROUTER_* value: the router refuses to start with it."""
        if s.router_max_lag < 1:
            raise ValueError("ROUTER_MAX_LAG must be >= 1")
        return cls(
            policy=policies.check_policy(s.router_policy),
            weights=policies.parse_weights(s.router_weights),
            heartbeat_timeout_s=s.router_heartbeat_timeout_s,
            max_lag=s.router_max_lag,
            groups=s.router_groups,
            sla_p95_ms=s.router_sla_p95_ms,
            sla_max_error_rate=s.router_sla_max_error_rate,
            sla_tiers=tuple(sla.parse_tiers(s.router_sla_tiers)),
            fallback=tuple(sla.parse_fallback(s.router_fallback).items()),
        )


class Router:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.fleet = Fleet(config.heartbeat_timeout_s, config.groups, config.max_lag)
        self.weights = policies.AdaptiveWeights(config.weights or policies.parse_weights("lag=1"))
        self.sla = sla.SlaWindow()
        self.fallback = dict(config.fallback)
        self.turn = 0  # round robin
        self._changed = asyncio.Event()
        self.lag_wanted = asyncio.Event()  # set by waiting shards: read the lag now (health.py)

    # ------------------------------------------------------------------ inputs

    def observe(self, hb: Heartbeat) -> None:
        if self.fleet.observe(hb) and hb.status != "stopped":
            self.sla.add(sla.Sample(hb.ts, hb.group, hb.latency_p95_ms, hb.error_rate))
        self.notify()

    def refresh_weights(self, now: float) -> None:
        for term, w in self.weights.observe(now, self.fleet.live_views(now)).items():
            ROUTER_POLICY_WEIGHT.labels(term=term).set(w)
        for model in self.fallback:  # the SLA gauges follow the fleet, not only the traffic
            self.sla_tier(model, now)

    # ------------------------------------------------------------------ decision

    def sla_tier(self, model: str, now: float) -> int:
        rate = self.sla.rate(
            self.fleet.serving(model), now, self.config.sla_p95_ms, self.config.sla_max_error_rate
        )
        level = sla.tier(rate, list(self.config.sla_tiers))
        ROUTER_SLA_VIOLATION.labels(model=model).set(rate)
        ROUTER_SLA_TIER.labels(model=model).set(level)
        return level

    def decide(self, shard: Shard, now: float) -> Placement | Blocked:
        models, level = [shard.model], 0
        if shard.sla_fallback and shard.worker_group is None and self.fallback:
            level = self.sla_tier(shard.model, now)
            models = sla.candidates(shard.model, self.fallback, level)
        shard_traits = policies.traits(shard)
        for model in models:
            views = self.fleet.views(model, shard.worker_group, now)
            if not views:
                continue  # nobody healthy serves this model: try the next candidate
            chosen = policies.choose(
                self.config.policy, views, shard_traits, weights=self.weights.current, turn=self.turn
            )
            if chosen is None:
                # saturated: wait for room rather than degrading the model for it
                return Blocked.SATURATED
            self.turn += 1
            self.fleet.groups[chosen.name].routed += 1
            return Placement(chosen.name, model, level)
        return Blocked.NO_GROUP

    # ------------------------------------------------------------------ waiting

    def notify(self) -> None:
        """Something changed (a heartbeat, a lag read): wake the shards waiting for room."""
        self._changed.set()
        self._changed = asyncio.Event()

    def want_lag(self) -> None:
        """A shard waits for room: fresh lag reads would show the room groups made."""
        self.lag_wanted.set()

    async def wait_change(self, timeout_s: float) -> None:
        await wait_event(self._changed, timeout_s)
