"""Bringing the stack up (install on first use, the hosts' network, the infrastructure, the
bootstrap, Prometheus, the services; restarting what runs with an outdated configuration or
other credentials), listing it and taking it down."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from localstack import hosts
from localstack.config import (
    PORTS,
    PROM_PORT,
    ROOT,
    STACK,
    VENV_PY,
    http_ok,
    log,
    run,
)
from localstack.credentials import CREDENTIAL_VARIABLES, client_env
from localstack.installs import install_apt, kafka_libs, toxiproxy_binary, weed_binary
from localstack.kafka import kafka_config_current
from localstack.proc import Proc
from localstack.prometheus import (
    prometheus_argv,
    prometheus_prepare,
    replica_targets,
    worker_ports,
    write_replica_targets,
    write_worker_targets,
)
from localstack.seaweed import (
    weed_config_current,
)
from localstack.services import (
    all_procs,
    host_client_env,
    host_infra,
    host_workers,
    infra,
    running_host_workers,
    running_replicas,
    running_workers,
    services,
)
from localstack.toxiproxy import (
    proxied_kafka_bootstrap,
    toxiproxy_url,
)


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


def all_hosts() -> list[hosts.Host]:
    services_host = [hosts.SERVICES_HOST] if hosts.services_host_configured() else []
    return services_host + hosts.hosts(hosts.configured())


def named_host(name: str) -> hosts.Host:
    n = hosts.configured()
    for h in all_hosts():
        if h.name == name:
            return h
    raise SystemExit(f"[stack] no host {name!r}: this stack has {n} host(s) (stack.py up --hosts N)")
