"""Prometheus, scraping the stack's services (workers through a file of targets)."""

from __future__ import annotations

import json

from evalstream.common.settings import SERVICE_PORTS
from localstack.config import PORTS, PROM_PORT, ROOT, STACK


def worker_ports(n: int) -> list[int]:
    return [PORTS["worker"] + i for i in range(n)]


def prometheus_prepare(worker_targets: list[str], addresses: dict[str, str] | None = None) -> None:
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
