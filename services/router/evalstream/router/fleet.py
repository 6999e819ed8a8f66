"""The router's view of the worker fleet, built from heartbeats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from evalstream.common.messages import Heartbeat
from evalstream.common.specs import serves


@dataclass
class Group:
    name: str
    model: str  # SPEC patterns, as advertised by its workers
    members: dict[str, Heartbeat] = field(default_factory=dict)

    def live_members(self, now: float, timeout_s: float) -> list[Heartbeat]:
        return [
            hb
            for hb in self.members.values()
            if now - hb.ts <= timeout_s and hb.status in ("ready", "starting")
        ]


class Fleet:
    def __init__(self, heartbeat_timeout_s: float = 15.0) -> None:
        self.groups: dict[str, Group] = {}
        self.heartbeat_timeout_s = heartbeat_timeout_s

    def observe(self, hb: Heartbeat) -> None:
        group = self.groups.setdefault(hb.group, Group(hb.group, hb.model))
        group.model = hb.model
        if hb.status == "stopped":
            group.members.pop(hb.worker_id, None)
        else:
            group.members[hb.worker_id] = hb

    def forget(self, worker_id: str) -> None:
        """A tombstone on the compacted topic: the worker left for good."""
        for g in self.groups.values():
            g.members.pop(worker_id, None)

    def eligible(self, model: str, pinned: str | None = None, now: float | None = None) -> list[Group]:
        """Healthy groups that serve `model` (only `pinned`, if the run pins a group)."""
        now = time.time() if now is None else now
        return [
            g
            for g in self.groups.values()
            if (pinned is None or g.name == pinned)
            and serves(g.model, model)
            and g.live_members(now, self.heartbeat_timeout_s)
        ]

    def known(self, model: str, pinned: str | None = None) -> bool:
        """Whether any group, healthy or not, has ever served `model`: shards for it wait
        (their group may come back) instead of being dead-lettered."""
        return any(
            (pinned is None or g.name == pinned) and serves(g.model, model) for g in self.groups.values()
        )
