"""Prometheus, scraping the stack's services (workers through a file of targets)."""

from __future__ import annotations

import json

from evalstream.common.settings import SERVICE_PORTS
from localstack.config import OFFSET, PORTS, PROM_PORT, ROOT, STACK

REPLICA_PORT_BASE = {"router": 8120, "aggregator": 8130}  # the n-th extra one: base + n


def worker_ports(n: int) -> list[int]:
    return [PORTS["worker"] + i for i in range(n)]


def replica_port(kind: str, index: int) -> int:
    """The port of router or aggregator number `index` (0: the first, on its usual port)."""
    return PORTS[kind] if index == 0 else REPLICA_PORT_BASE[kind] + OFFSET + index


def replica_ports(kind: str, n: int) -> list[tuple[str, int]]:
    """(name, port) of n routers or aggregators: `router`, `router-1`, ..."""
    return [(kind if i == 0 else f"{kind}-{i}", replica_port(kind, i)) for i in range(n)]


def replica_targets(
    routers: int, aggregators: int, addresses: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """The extra routers' and aggregators' host:port, by service."""
    return {
        kind: [f"{(addresses or {}).get(kind, '127.0.0.1')}:{port}" for _, port in replica_ports(kind, n)[1:]]
        for kind, n in (("router", routers), ("aggregator", aggregators))
    }


def prometheus_prepare(
    worker_targets: list[str],
    addresses: dict[str, str] | None = None,
    replicas: dict[str, list[str]] | None = None,
) -> None:
    """Its configuration, for services on loopback or, named in `addresses`, elsewhere (the
    router and aggregator on a host of their own)."""
    d = STACK / "prometheus"
    (d / "data").mkdir(parents=True, exist_ok=True)
    src = (ROOT / "ops/prometheus/prometheus.local.yml").read_text()
    src = src.replace("__STACK__", str(d)).replace("__ROOT__", str(ROOT))
    for name, port in SERVICE_PORTS.items():
        address = (addresses or {}).get(name, "127.0.0.1")
        src = src.replace(f"127.0.0.1:{port}", f"{address}:{PORTS[name]}")
    src = src.replace("127.0.0.1:9090", f"127.0.0.1:{PROM_PORT}")
    (d / "prometheus.yml").write_text(src)
    write_worker_targets(worker_targets)
    write_replica_targets(replicas or {})
    spawned = d / "spawned.json"  # targets tests add for the services they start
    if not spawned.exists():
        spawned.write_text("[]")


def write_worker_targets(worker_targets: list[str]) -> None:
    """The workers' host:port (on loopback, or on their hosts with `up --hosts`)."""
    d = STACK / "prometheus"
    d.mkdir(parents=True, exist_ok=True)
    targets = [{"targets": worker_targets, "labels": {"service": "worker"}}]
    tmp = d / "workers.json.tmp"
    tmp.write_text(json.dumps(targets))
    tmp.replace(d / "workers.json")


def write_replica_targets(replicas: dict[str, list[str]]) -> None:
    """The extra routers and aggregators (`up --routers N --aggregators N`), each group
    labelled with its service, so that rules and boards count every instance."""
    d = STACK / "prometheus"
    d.mkdir(parents=True, exist_ok=True)
    groups = [{"targets": t, "labels": {"service": kind}} for kind, t in sorted(replicas.items()) if t]
    tmp = d / "replicas.json.tmp"
    tmp.write_text(json.dumps(groups))
    tmp.replace(d / "replicas.json")


def prometheus_argv() -> list[str]:
    d = STACK / "prometheus"
    return [
        "prometheus",
        f"--config.file={d / 'prometheus.yml'}",
        f"--storage.tsdb.path={d / 'data'}",
        f"--web.listen-address=127.0.0.1:{PROM_PORT}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=7d",
    ]
