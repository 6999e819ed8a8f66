"""Parking: what the router does with a shard that no healthy group serves.

It waits, but only ROUTER_PARK_AFTER_S (the group may be restarting; a model no group ever
served does not wait at all); then it is parked on
the retry topic and looked at again later (`interval`), so that one run pinned to a dead
group never stalls the other runs sharing its partition. The shards behind one that was
just parked for the same target (model, pinned group) park at once, so that a dead group's
backlog leaves the partition at publish speed. If no group has *ever* served the model for
ROUTER_NO_GROUP_TIMEOUT_S, or its groups stay dead for ROUTER_PARK_TIMEOUT_S, the shard is
unroutable: its items are dead-lettered, so that the run still ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from evalstream.common.messages import Shard
from evalstream.router.routing import Blocked

Target = tuple[str, str | None]  # (model, pinned group)


@dataclass
class ParkingPolicy:
    park_after_s: float
    park_timeout_s: float
    no_group_timeout_s: float
    can_park: bool  # there is a retry topic to park on
    interval_s: float = 5.0  # a parked shard is looked at again after this long at first ...
    interval_max_s: float = 30.0  # ... and less often the longer its group stays dead
    max_targets: int = 1024  # targets remembered (models come from jobs: unbounded)
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _last_parked: dict[Target, float] = field(default_factory=dict, repr=False)

    def wait_for(self, shard: Shard, known: Callable[[], bool]) -> ShardWait:
        """How long this shard may wait for a group. `known()`: whether any group, healthy
        or not, has ever served its model (asked when the wait ends: the fleet changes)."""
        now = self.monotonic()
        last = self._last_parked.get((shard.model, shard.worker_group))
        recently = last is not None and now - last < self.interval_s
        # A model no group has ever served is not restarting: waiting for it would only
        # hold the partition (a job may name any model), so it parks at once.
        return ShardWait(
            policy=self,
            parked_at=shard.parked_at or self.wall(),
            park_from=now if recently or not known() else now + self.park_after_s,
            known=known,
        )

    def parked(self, shard: Shard) -> None:
        """The shard left its partition (parked or dead-lettered): the ones behind it for the
        same target need not wait."""
        now = self.monotonic()
        self._last_parked.pop((shard.model, shard.worker_group), None)  # re-inserted: newest last
        self._last_parked[(shard.model, shard.worker_group)] = now
        if len(self._last_parked) > self.max_targets:
            for target, at in list(self._last_parked.items()):
                if now - at >= self.interval_s or len(self._last_parked) > self.max_targets:
                    del self._last_parked[target]

    def interval(self, parked_at: float) -> float:
        """A quarter of the time parked so far, within [interval_s, interval_max_s]: a
        long-dead group's backlog does not churn through eval.retry every few seconds, and a
        group that comes back is noticed at once anyway (the router's hold_until_due)."""
        return min(self.interval_max_s, max(self.interval_s, (self.wall() - parked_at) / 4))


@dataclass
class ShardWait:
    policy: ParkingPolicy
    parked_at: float  # wall clock: when the shard first found no group
    park_from: float  # monotonic: when it stops waiting and parks
    known: Callable[[], bool]

    def give_up(self, reason: Blocked) -> bool:
        """Whether a shard blocked for `reason` stops waiting now (a saturated group is
        always waited for: that is back-pressure). Without a retry topic to park on, it
        waits until it is unroutable: giving up earlier would drop it."""
        if reason is not Blocked.NO_GROUP:
            return False
        if self.policy.can_park:
            return self.policy.monotonic() >= self.park_from
        return self.unroutable()

    def unroutable(self) -> bool:
        waited = self.policy.wall() - self.parked_at
        if self.known():
            return waited > self.policy.park_timeout_s
        return waited > self.policy.no_group_timeout_s

    def not_before(self) -> float:
        """When the parked shard is due again."""
        return self.policy.wall() + self.policy.interval(self.parked_at)
