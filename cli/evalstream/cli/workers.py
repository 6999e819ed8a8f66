"""`evalctl workers`: worker groups, their members, model, lag, GPU utilisation, p95 and health."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from evalstream.cli.common import (
    out_json,
    read_heartbeats,
)
from evalstream.common import fleet, topics
from evalstream.common.lag import group_lag
from evalstream.common.messages import Heartbeat
from evalstream.common.settings import Settings

RECENT_S = 3600.0  # `evalctl workers` hides groups silent for longer (unless --all)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def worker_group_row(
    beats: list[Heartbeat], lag: dict[int, int], now: float, timeout_s: float, max_lag: int
) -> dict[str, Any]:
    """One group as `evalctl workers` shows it, judged by the router's rules: liveness from
    evalstream.common.fleet; the group is saturated at ROUTER_MAX_LAG outstanding shards per
    live member."""
    members = sorted((hb for hb in beats if hb.status != "stopped"), key=lambda hb: hb.worker_id)
    live = fleet.live_members(members, now, timeout_s)
    total_lag = sum(lag.values())
    partitions = len(lag)  # of the group's work topic: one member works each, at most
    return {
        "group": beats[0].group,
        "model": max(beats, key=lambda hb: hb.ts).model,
        "health": fleet.group_health(len(live), len(members)),
        "healthy": len(live),
        "members": [
            {
                "worker_id": hb.worker_id,
                "status": hb.status if hb in live else "stale",
                "device": hb.device,
                "gpu_utilization": hb.gpu_utilization,
                "cpu_utilization": hb.cpu_utilization,
                "p95_ms": hb.latency_p95_ms,
                "queue_depth": hb.queue_depth,
                "age_s": round(now - hb.ts, 1),
            }
            for hb in members
        ],
        "partitions": partitions,
        # a consumer group gives each partition to one member: the rest wait, idle
        "idle_members": max(0, len(live) - partitions) if partitions else 0,
        "lag": total_lag,
        "lag_by_partition": {str(p): n for p, n in sorted(lag.items())},
        "saturated": total_lag >= max_lag * len(live) if live else None,
        "gpu_utilization": _mean([hb.gpu_utilization for hb in live]),
        "cpu_utilization": _mean([hb.cpu_utilization for hb in live]),
        "gpu_memory_pressure": fleet.memory_pressure(live),
        "p95_ms": _mean([hb.latency_p95_ms for hb in live]),
        "last_heartbeat_s": round(now - max(hb.ts for hb in beats), 1),
    }


async def cmd_workers(args: argparse.Namespace, settings: Settings) -> None:
    now = time.time()
    by_group: dict[str, list[Heartbeat]] = {}
    for hb in await read_heartbeats(settings):
        by_group.setdefault(hb.group, []).append(hb)
    shown = {
        g: beats for g, beats in by_group.items() if args.all or now - max(b.ts for b in beats) < RECENT_S
    }
    lags = await asyncio.gather(
        *(group_lag(settings, topics.worker_consumer_group(g), topics.work_topic(g)) for g in shown)
    )
    rows = [
        worker_group_row(beats, lag, now, settings.router_heartbeat_timeout_s, settings.router_max_lag)
        for beats, lag in zip(shown.values(), lags, strict=True)
    ]
    rows.sort(key=lambda r: (r["health"] == "dead", r["group"]))
    if args.json:
        out_json(rows)
        return

    def pct(v: float | None) -> str:
        return f"{100 * v:.0f}" if v is not None else "-"

    print(
        f"{'group':<24} {'model':<36} {'health':<8} {'live':>5} {'lag':>6} {'full':>4} "
        f"{'gpu%':>5} {'mem%':>5} {'p95 ms':>8}"
    )
    for r in rows:
        p95 = f"{r['p95_ms']:.0f}" if r["p95_ms"] is not None else "-"
        full = {True: "yes", False: "no", None: "-"}[r["saturated"]]
        print(
            f"{r['group']:<24} {r['model'][:36]:<36} {r['health']:<8} {r['healthy']:>2}/{len(r['members']):<2} "
            f"{r['lag']:>6} {full:>4} {pct(r['gpu_utilization']):>5} {pct(r['gpu_memory_pressure']):>5} {p95:>8}"
        )
        if r["idle_members"]:
            print(
                f"    {r['idle_members']} of {r['healthy']} live members idle: {topics.work_topic(r['group'])} has "
                f"{r['partitions']} partitions (raise KAFKA_PARTITIONS_WORK and run bootstrap)"
            )
        for m in r["members"]:
            util = m["gpu_utilization"] if m["gpu_utilization"] is not None else m["cpu_utilization"]
            print(
                f"    {m['worker_id']:<32} {m['status']:<8} {m['device'][:28]:<28} util {pct(util)}%  "
                f"p95 {m['p95_ms']:.0f} ms  queue {m['queue_depth']}  age {m['age_s']}s"
            )
    hidden = len(by_group) - len(shown)
    if hidden:
        print(f"({hidden} group(s) silent for over {RECENT_S / 3600:.0f} h not shown: --all)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser("workers", help="worker groups: members, model, lag, GPU utilisation, p95, health")
    w.add_argument("--json", action="store_true")
    w.add_argument("--all", action="store_true", help="also groups silent for over an hour")
    w.set_defaults(handler=cmd_workers)
