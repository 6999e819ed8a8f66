"""Worker liveness from heartbeats: the one rule by which the router routes and evalctl
(`workers`, `reproduce`) reports. A member is live while its last heartbeat is younger than
ROUTER_HEARTBEAT_TIMEOUT_S and it is ready or starting (not stopping or stopped); a group
with no live member is dead."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from evalstream.common.messages import Heartbeat

LIVE_STATUSES = frozenset({"ready", "starting"})
Health = Literal["healthy", "degraded", "dead"]


def is_live(hb: Heartbeat, now: float, timeout_s: float) -> bool:
    return now - hb.ts <= timeout_s and hb.status in LIVE_STATUSES


def live_members(beats: Iterable[Heartbeat], now: float, timeout_s: float) -> list[Heartbeat]:
    return [hb for hb in beats if is_live(hb, now, timeout_s)]


def memory_pressure(live: Iterable[Heartbeat]) -> float | None:
    """Mean share of GPU memory in use over the members that report it, or None."""
    shares = [
        hb.gpu_memory_used_bytes / (hb.gpu_memory_used_bytes + hb.gpu_memory_free_bytes)
        for hb in live
        if hb.gpu_memory_used_bytes is not None
        and hb.gpu_memory_free_bytes is not None
        and hb.gpu_memory_used_bytes + hb.gpu_memory_free_bytes > 0
    ]
    return sum(shares) / len(shares) if shares else None


def group_health(live: int, members: int) -> Health:
    """A group with `live` of its `members` (stopped ones not counted) live."""
    if not live:
        return "dead"
    return "healthy" if live == members else "degraded"
