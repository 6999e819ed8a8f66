"""The stack's processes, by name: the infrastructure (Kafka, PostgreSQL, S3, and on the hosts'
network S3's listener there and the fault proxy), the services (producer, routers, aggregators,
workers; on hosts or beside the infrastructure), each with its environment and its health
check, and the ones running now (from their pid files)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from localstack import hosts
from localstack.config import (
    KAFKA_HOSTS_PORT,
    PORTS,
    ROOT,
    STACK,
    http_ok,
)
from localstack.credentials import client_env
from localstack.kafka import kafka_argv, kafka_healthy, kafka_prepare
from localstack.postgres import Postgres
from localstack.proc import Proc
from localstack.prometheus import (
    prometheus_argv,
    replica_port,
    replica_ports,
    worker_ports,
)
from localstack.seaweed import (
    weed_argv,
    weed_healthy,
    weed_hosts_argv,
    weed_hosts_healthy,
    weed_prepare,
)
from localstack.toxiproxy import (
    proxied_kafka_bootstrap,
    toxiproxy_argv,
    toxiproxy_healthy,
    toxiproxy_prepare,
)


def service(
    name: str, port: int, extra_env: dict[str, str] | None = None, host: hosts.Host | None = None
) -> Proc:
    """A service process; with `host`, inside that host's network namespace, listening on
    the host's address and reaching the infrastructure at its address on the hosts' network."""
    kind = next(k for k in ("producer", "router", "aggregator", "worker") if k in name.split("-"))
    program = str(ROOT / ".venv/bin" / f"evalstream-{kind}")
    address = host.address if host else "127.0.0.1"
    # each service is its own principal: Kafka (acls.py), database role (db_roles.py) and S3
    # key pair (s3_identities.py); the router and workers get no S3 keys, the router no role
    env = {"HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1", **client_env(kind)}
    if host:
        env |= {"HTTP_HOST": host.address, **host_client_env(principal=kind)}
    if kind == "worker":  # the one folder its replay: files are read from (tests write theirs there)
        env["REPLAY_ROOT"] = str(STACK / "replay")
    return Proc(
        name=name,
        argv=lambda: host.exec_argv([program]) if host else [program],
        healthy=lambda: http_ok(f"http://{address}:{port}/healthz"),
        timeout=180,
        env={**env, **(extra_env or {})},
    )


def host_client_env(via_proxy: bool = False, principal: str = "user") -> dict[str, str]:
    """client_env() as a host sees it: the same settings and credentials, with every endpoint
    at the infrastructure's address on the hosts' network (Kafka: its HOSTS listener, or the
    fault proxy in front of its PROXIED listener)."""
    env = client_env(principal)
    gateway = hosts.gateway()

    def moved(url: str) -> str:
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{gateway}:{parts.port}"))

    env["KAFKA_BOOTSTRAP"] = proxied_kafka_bootstrap() if via_proxy else f"{gateway}:{KAFKA_HOSTS_PORT}"
    env["DATABASE_URL"] = moved(env["DATABASE_URL"]) if env["DATABASE_URL"] else ""  # the router has none
    env["S3_ENDPOINT"] = moved(env["S3_ENDPOINT"])
    env.pop("PROMETHEUS_URL", None)  # on the infrastructure's loopback only
    return env


def host_workers(n_hosts: int, workers: int) -> list[Proc]:
    """`workers` workers on each host, a worker group per host (hostN)."""
    return [
        service(
            f"{h.name}-worker-{j}",
            PORTS["worker"] + j,
            {"WORKER_GROUP": h.group, "WORKER_ID": f"{h.name}-worker-{j}"},
            host=h,
        )
        for h in hosts.hosts(n_hosts)
        for j in range(workers)
    ]


def running_host_workers() -> list[Proc]:
    out = []
    for p in sorted((STACK / "run").glob("host*-worker-*.pid")):
        host_name, _, j = p.stem.partition("-worker-")
        if host_name.removeprefix("host").isdigit() and j.isdigit():
            host = hosts.Host(int(host_name.removeprefix("host")))
            out.append(service(p.stem, PORTS["worker"] + int(j), host=host))
    return out


def host_infra() -> list[Proc]:
    """What the hosts' network adds on the infrastructure's side."""
    return [
        Proc("s3-hosts", weed_hosts_argv, weed_hosts_healthy, timeout=60),
        Proc(
            "toxiproxy",
            toxiproxy_argv,
            toxiproxy_healthy,
            timeout=30,
            env={"LOG_LEVEL": "info"},  # its default logs every byte moved
            prepare=toxiproxy_prepare,
        ),
    ]


def services(workers: int, services_host: bool = False, routers: int = 1, aggregators: int = 1) -> list[Proc]:
    """The producer, `routers` routers and `aggregators` aggregators (each kind one consumer
    group; on host0 with --services-host) and `workers` workers beside the infrastructure."""
    host = hosts.SERVICES_HOST if services_host else None
    procs = [service("producer", PORTS["producer"])]
    procs += [service(name, port, host=host) for name, port in replica_ports("router", routers)]
    procs += [service(name, port, host=host) for name, port in replica_ports("aggregator", aggregators)]
    procs += [
        service(f"worker-{i}", p, {"WORKER_ID": f"worker-{i}"}) for i, p in enumerate(worker_ports(workers))
    ]
    return procs


def running_replicas(host: hosts.Host | None = None) -> list[Proc]:
    """The extra routers and aggregators running now (router-1, aggregator-1, ...)."""
    out = []
    for kind in ("router", "aggregator"):
        for p in sorted((STACK / "run").glob(f"{kind}-*.pid")):
            index = p.stem.removeprefix(f"{kind}-")
            if index.isdigit():
                out.append(service(p.stem, replica_port(kind, int(index)), host=host))
    return out


def infra() -> list[Proc]:
    return [
        Proc("kafka", kafka_argv, kafka_healthy, timeout=90, prepare=kafka_prepare),
        Postgres(),
        Proc("s3", weed_argv, weed_healthy, timeout=90, prepare=weed_prepare),
    ]


def running_workers() -> list[Proc]:
    return [service(p.stem, 0) for p in sorted((STACK / "run").glob("worker-*.pid"))]


def all_procs() -> list[Proc]:
    prometheus = Proc("prometheus", prometheus_argv, lambda: True)
    return [
        *running_host_workers(),
        *running_workers(),
        *running_replicas(hosts.SERVICES_HOST if hosts.services_host_configured() else None),
        *services(0, hosts.services_host_configured()),
        prometheus,
        *host_infra(),
        *infra(),
    ]
