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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "libs" / "common"), str(Path(__file__).resolve().parent)]
from localstack import hosts  # noqa: E402
from localstack.config import KAFKA_PORT, PG_PORT, PROM_PORT, S3_PORT  # noqa: E402
from localstack.credentials import client_env  # noqa: E402
from localstack.installs import kafka_tools_libs  # noqa: E402
from localstack.prometheus import worker_ports  # noqa: E402
from localstack.services import all_procs, host_client_env  # noqa: E402
from localstack.supervise import clean, down, named_host, ps, show_hosts, up  # noqa: E402

# What other tools read from this module (tests/unit/compose_files.py, bench/).
__all__ = [
    "KAFKA_PORT",
    "PG_PORT",
    "PROM_PORT",
    "S3_PORT",
    "client_env",
    "host_client_env",
    "main",
    "worker_ports",
]


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


if __name__ == "__main__":
    main()
