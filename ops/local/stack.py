#!/usr/bin/env python3
"""The evalstream topology as local processes, for machines without a Docker engine.

    python ops/local/stack.py up [--workers N] [--hosts N] [--infra-only]   install on first use, start, wait healthy
    python ops/local/stack.py ps | hosts | down | clean
    python ops/local/stack.py env [--principal user|admin|producer|...] [--host NAME [--via-proxy]]
    python ops/local/stack.py link HOST up|down       a host's network link (down: a partition)

--hosts N rehearses a cluster on this machine: N network namespaces ("hosts", each a worker
group of --workers workers) on a private network of their own, reaching Kafka, PostgreSQL
and S3 at the infrastructure's address over veth links (localstack/hosts.py).

Installs are cached under $EVALSTREAM_CACHE (default ~/.cache/evalstream); data, pid files
and logs live in one folder, $EVALSTREAM_STACK (default <repo>/.stack). `up` starts only
what is not running, so a second `up` takes seconds. Standard library only (plus the
project's venv for the bootstrap step), so it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "libs" / "common"), str(Path(__file__).resolve().parent)]
from localstack import hosts  # noqa: E402
from localstack.config import (  # noqa: E402
    KAFKA_HOSTS_PORT,
    KAFKA_PORT,
    PG_PORT,
    PORTS,
    PROM_PORT,
    S3_PORT,
    STACK,
    VENV_PY,
    client_env,
    http_ok,
    log,
    run,
)
from localstack.credentials import CREDENTIAL_VARIABLES  # noqa: E402
from localstack.installs import (  # noqa: E402
    install_apt,
    kafka_libs,
    kafka_tools_libs,
    toxiproxy_binary,
    weed_binary,
)
from localstack.kafka import kafka_argv, kafka_config_current, kafka_healthy, kafka_prepare  # noqa: E402
from localstack.postgres import Postgres  # noqa: E402
from localstack.proc import Proc  # noqa: E402
from localstack.prometheus import (  # noqa: E402
    prometheus_argv,
    prometheus_prepare,
    replica_port,
    replica_ports,
    replica_targets,
    worker_ports,
    write_replica_targets,
    write_worker_targets,
)
from localstack.seaweed import (  # noqa: E402
    weed_argv,
    weed_config_current,
    weed_healthy,
    weed_hosts_argv,
    weed_hosts_healthy,
    weed_prepare,
)
from localstack.toxiproxy import (  # noqa: E402
    proxied_kafka_bootstrap,
    toxiproxy_argv,
    toxiproxy_healthy,
    toxiproxy_prepare,
    toxiproxy_url,
)

# What other tools read from this module (tests/unit/test_compose.py, bench/).
__all__ = ["KAFKA_PORT", "PG_PORT", "PROM_PORT", "S3_PORT", "client_env", "main", "worker_ports"]


# --------------------------------------------------------------------------- services


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


def bootstrap() -> None:
    """Topics, ACLs, buckets and the database schema, as the Kafka admin; idempotent."""
    run(
        [str(VENV_PY), "-m", "evalstream.common.bootstrap"],
        cwd=ROOT,
        env={**os.environ, **client_env("admin")},
    )


def set_hosts(n_hosts: int, services_host: bool) -> None:
    """Records the stack's hosts. Kafka and PostgreSQL listen on the hosts' network only
    while it exists: crossing between none and some restarts those that run (their data
    stays); the network is made before they start and removed after they stop. Moving the
    router and aggregator (--services-host) restarts them and Prometheus, which scrapes them."""
    before, services_before = hosts.configured(), hosts.services_host_configured()
    services_host = services_host and n_hosts > 0
    for p in running_host_workers():  # on hosts that are going away
        if int(p.name.partition("-")[0].removeprefix("host")) > n_hosts:
            p.stop()
    if services_host != services_before:
        prometheus = Proc("prometheus", prometheus_argv, lambda: True)
        for p in [*services(0, services_before)[1:], *running_replicas(), prometheus]:
            p.stop()
    if n_hosts > 0:
        toxiproxy_binary()
        hosts.create(n_hosts, services_host)
    if (before > 0) != (n_hosts > 0):
        moving = [p for p in infra() if p.name != "s3" and p.pid() is not None]
        for p in [*running_host_workers(), *host_infra(), *moving]:
            p.stop()
        hosts.save(n_hosts, services_host, {})
        if moving:
            joins = "join" if n_hosts else "leave"
            log(f"restarted {', '.join(p.name for p in moving)} to {joins} the hosts' network")
    if n_hosts == 0:
        hosts.destroy()
    hosts.save(n_hosts, services_host, {})


def describe_hosts(n_hosts: int, workers: int, services_host: bool) -> dict[str, object]:
    """hosts.json: the topology tests and operators read (`stack.py hosts`); no secrets."""
    on_host0 = hosts.SERVICES_HOST
    return {
        "services": {"netns": on_host0.netns, "address": on_host0.address, "runs": ["router", "aggregator"]}
        if services_host
        else None,
        "network": str(hosts.subnet()),
        "bridge": hosts.bridge(),
        "infrastructure": hosts.gateway(),
        "kafka_bootstrap": host_client_env()["KAFKA_BOOTSTRAP"] if n_hosts else None,
        "kafka_bootstrap_proxied": proxied_kafka_bootstrap() if n_hosts else None,
        "toxiproxy": toxiproxy_url() if n_hosts else None,
        "machines": [
            {
                "name": h.name,
                "netns": h.netns,
                "veth": h.veth,
                "address": h.address,
                "group": h.group,
                "workers": [f"{h.name}-worker-{j}" for j in range(workers)],
            }
            for h in hosts.hosts(n_hosts)
        ],
    }


def worker_targets(workers: int, n_hosts: int) -> list[str]:
    if n_hosts:
        return [f"{h.address}:{PORTS['worker'] + j}" for h in hosts.hosts(n_hosts) for j in range(workers)]
    return [f"127.0.0.1:{p}" for p in worker_ports(workers)]


def up(
    workers: int,
    infra_only: bool,
    n_hosts: int | None = None,
    services_host: bool | None = None,
    routers: int = 1,
    aggregators: int = 1,
) -> None:
    t0 = time.monotonic()
    install_apt()
    kafka_libs()
    weed_binary()
    STACK.mkdir(parents=True, exist_ok=True)
    n_hosts = hosts.configured() if n_hosts is None else n_hosts
    if services_host is None:
        services_host = hosts.services_host_configured()
    services_host = services_host and n_hosts > 0
    set_hosts(n_hosts, services_host)
    procs = infra()
    if procs[0].pid() is not None and not kafka_config_current():
        # A broker (and its clients) from before authentication: restarted with SASL/SCRAM.
        log("Kafka runs without this stack's SASL/SCRAM configuration: restarting it and the services")
        for p in [*running_workers(), *running_host_workers(), *running_replicas(), *services(0), procs[0]]:
            p.stop()
    s3_pid = procs[2].pid()
    if s3_pid is not None and not weed_config_current(s3_pid):
        # A store from before its identities and security.toml (or with other ones): restarted
        # with them; the services, whose S3 keys change with it, drain first.
        log("SeaweedFS runs without this stack's identities and security: restarting it and the services")
        for p in [
            *running_workers(),
            *running_host_workers(),
            *running_replicas(),
            *services(0),
            *(p for p in host_infra() if p.name == "s3-hosts"),
        ]:
            p.stop()
        procs[2].stop()
    targets = worker_targets(workers, n_hosts)
    moved = {n: hosts.SERVICES_HOST.address for n in ("router", "aggregator")} if services_host else {}
    prometheus = Proc(
        "prometheus",
        prometheus_argv,
        lambda: http_ok(f"http://127.0.0.1:{PROM_PORT}/-/ready"),
        timeout=60,
        prepare=lambda: prometheus_prepare(targets, moved, replica_targets(routers, aggregators, moved)),
    )
    started = [p.name for p in procs if p.start()]
    for p in procs:
        p.wait_healthy()
    bootstrap()
    if n_hosts:
        extra = host_infra()
        started += [p.name for p in extra if p.start()]
        for p in extra:
            p.wait_healthy()
    if prometheus.start():
        started.append("prometheus")
    else:
        write_worker_targets(targets)
        write_replica_targets(replica_targets(routers, aggregators, moved))
    prometheus.wait_healthy()
    if not infra_only:
        # With hosts, every worker runs on a host: none on the infrastructure's machine.
        svcs = services(0 if n_hosts else workers, services_host, routers, aggregators)
        svcs += host_workers(n_hosts, workers)
        # Scale down: workers, routers and aggregators beyond the requested counts are
        # stopped (they drain first).
        wanted = {p.name for p in svcs}
        for extra_worker in [*running_workers(), *running_host_workers(), *running_replicas()]:
            if extra_worker.name not in wanted:
                extra_worker.stop()
        for p in svcs:
            stop_if_credentials_changed(p)
        started += [p.name for p in svcs if p.start()]
        for p in svcs:
            p.wait_healthy()
    hosts.save(n_hosts, services_host, describe_hosts(n_hosts, workers, services_host))
    what = ", ".join(started) if started else "nothing (all running)"
    where = f"; {n_hosts} hosts on {hosts.subnet()}" if n_hosts else ""
    log(f"up in {time.monotonic() - t0:.1f}s; started: {what}; stack folder: {STACK}{where}")


def running_environ(pid: int) -> dict[str, str] | None:
    """The environment a running process was started with (None if it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def stop_if_credentials_changed(p: Proc) -> None:
    """Stops a running service whose credentials (Kafka principal, database role, S3 keys)
    are not the ones it would get now, e.g. one started before it had a role of its own:
    `up` starts it again with them."""
    pid = p.pid()
    running = running_environ(pid) if pid is not None else None
    if running is None:
        return
    changed = [k for k in CREDENTIAL_VARIABLES if running.get(k, "") != p.env.get(k, "")]
    if changed:
        log(f"{p.name} runs with other credentials ({', '.join(changed)}): restarting it")
        p.stop()


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


def ps() -> None:
    for p in all_procs():
        pid = p.pid()
        state = f"running pid {pid}" if pid else "stopped"
        print(f"{p.name:<14} {state:<20} log: {p.logfile}")


def down() -> None:
    # Services first (they drain into Kafka and PostgreSQL), infrastructure last.
    for p in all_procs():
        if p.pid() is not None:
            log(f"stopping {p.name}")
        p.stop()
    hosts.destroy()  # every namespace, link and address; `up` makes them again


def show_hosts() -> None:
    n = hosts.configured()
    if not n:
        print("no hosts (stack.py up --hosts N)")
        return
    print(f"network {hosts.subnet()}, infrastructure at {hosts.gateway()} (bridge {hosts.bridge()})")
    for h in all_hosts():
        try:
            link = "up" if hosts.link_up(h) else "DOWN (partitioned)"
        except Exception:
            link = "absent"
        print(f"{h.name:<8} {h.address:<15} netns {h.netns:<26} link {h.veth} {link}")


def clean() -> None:
    down()
    shutil.rmtree(STACK, ignore_errors=True)
    log(f"removed {STACK}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="install on first use, start what is not running, wait until healthy")
    p_up.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "1")))
    p_up.add_argument(
        "--routers",
        type=int,
        default=int(os.environ.get("ROUTERS", "1")),
        help="routers in the router's consumer group (at most KAFKA_PARTITIONS_SHARDS do work)",
    )
    p_up.add_argument(
        "--aggregators",
        type=int,
        default=int(os.environ.get("AGGREGATORS", "1")),
        help="aggregators in the aggregator's consumer groups (at most KAFKA_PARTITIONS_RESULTS do work)",
    )
    p_up.add_argument("--infra-only", action="store_true", help="Kafka, PostgreSQL, S3 and Prometheus only")
    p_up.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="run the workers on N network-namespace hosts, --workers each, a worker group per host "
        "(needs root); 0: back to one machine; default: as the stack was last brought up",
    )
    p_up.add_argument(
        "--services-host",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --hosts: the router and aggregator on a host of their own (host0); "
        "default: as the stack was last brought up",
    )
    sub.add_parser("ps", help="list the stack's processes")
    sub.add_parser("hosts", help="the stack's hosts: addresses, namespaces, links")
    p_env = sub.add_parser(
        "env",
        help="print `export` lines that point clients (evalctl, tests) at this stack, with their credentials",
    )
    p_env.add_argument(
        "--principal",
        default="user",
        help="whose credentials (Kafka principal, database role, S3 key pair): user (default: evalctl, "
        "job publishers; reads the database), producer, router, worker, aggregator, or admin (the "
        "broker's super user, the tables' owner, the store's admin: bootstrap, test setup)",
    )
    p_env.add_argument("--host", help="as a process on this host (e.g. host1) sees the stack")
    p_env.add_argument("--via-proxy", action="store_true", help="with --host: Kafka through the fault proxy")
    p_link = sub.add_parser("link", help="take a host's network link down (a partition) or up (healed)")
    p_link.add_argument("host", help="e.g. host1")
    p_link.add_argument("state", choices=["up", "down"])
    sub.add_parser(
        "kafka-tools-classpath", help="the classpath of Kafka's command-line tools (fetched on first use)"
    )
    sub.add_parser("down", help="stop everything (data is kept)")
    sub.add_parser("clean", help="stop everything and delete the stack folder (data, logs)")
    p_stop = sub.add_parser("stop", help="stop one process by name")
    p_stop.add_argument("name")
    args = ap.parse_args()
    if args.cmd == "up":
        if args.hosts is not None and args.hosts < 0:
            ap.error("--hosts must be 0 or more")
        if args.routers < 1 or args.aggregators < 1:
            ap.error("--routers and --aggregators must be 1 or more")
        up(args.workers, args.infra_only, args.hosts, args.services_host, args.routers, args.aggregators)
    elif args.cmd == "ps":
        ps()
    elif args.cmd == "hosts":
        show_hosts()
    elif args.cmd == "env":
        env = client_env(args.principal)
        if args.host:
            named_host(args.host)
            env = host_client_env(args.via_proxy, args.principal)
        print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()))
    elif args.cmd == "link":
        hosts.set_link(named_host(args.host), args.state == "up")
    elif args.cmd == "kafka-tools-classpath":
        with contextlib.redirect_stdout(sys.stderr):
            libs = kafka_tools_libs()
        print(f"{libs}/*")
    elif args.cmd == "down":
        down()
    elif args.cmd == "clean":
        clean()
    elif args.cmd == "stop":
        for p in all_procs():
            if p.name == args.name:
                p.stop()


def all_hosts() -> list[hosts.Host]:
    services_host = [hosts.SERVICES_HOST] if hosts.services_host_configured() else []
    return services_host + hosts.hosts(hosts.configured())


def named_host(name: str) -> hosts.Host:
    n = hosts.configured()
    for h in all_hosts():
        if h.name == name:
            return h
    raise SystemExit(f"[stack] no host {name!r}: this stack has {n} host(s) (stack.py up --hosts N)")


if __name__ == "__main__":
    main()
