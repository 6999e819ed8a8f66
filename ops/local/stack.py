#!/usr/bin/env python3
"""The evalstream topology as local processes, for machines without a Docker engine.

    python ops/local/stack.py up [--workers N] [--infra-only]   install on first use, start, wait healthy
    python ops/local/stack.py ps | down | clean | logs NAME

Installs are cached under $EVALSTREAM_CACHE (default ~/.cache/evalstream); data, pid files
and logs live in one folder, $EVALSTREAM_STACK (default <repo>/.stack). `up` starts only
what is not running, so a second `up` takes seconds. Standard library only (plus the
project's venv for the bootstrap step), so it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "libs" / "common"), str(Path(__file__).resolve().parent)]
from localstack.config import (  # noqa: E402
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
from localstack.installs import install_apt, kafka_libs, kafka_tools_libs, weed_binary  # noqa: E402
from localstack.kafka import kafka_argv, kafka_healthy, kafka_prepare  # noqa: E402
from localstack.postgres import Postgres  # noqa: E402
from localstack.proc import Proc  # noqa: E402
from localstack.prometheus import (  # noqa: E402
    prometheus_argv,
    prometheus_prepare,
    worker_ports,
    write_worker_targets,
)
from localstack.seaweed import weed_argv, weed_healthy, weed_prepare  # noqa: E402

# What other tools read from this module (tests/unit/test_compose.py, bench/).
__all__ = ["KAFKA_PORT", "PG_PORT", "PROM_PORT", "S3_PORT", "client_env", "main", "worker_ports"]


# --------------------------------------------------------------------------- services


def service(name: str, port: int, extra_env: dict[str, str] | None = None) -> Proc:
    return Proc(
        name=name,
        argv=lambda: [str(ROOT / ".venv/bin" / f"evalstream-{name.split('-')[0]}")],
        healthy=lambda: http_ok(f"http://127.0.0.1:{port}/healthz"),
        timeout=180,
        env={"HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1", **client_env(), **(extra_env or {})},
    )


def services(workers: int) -> list[Proc]:
    procs = [service(n, PORTS[n]) for n in ("producer", "router", "aggregator")]
    procs += [
        service(f"worker-{i}", p, {"WORKER_ID": f"worker-{i}"}) for i, p in enumerate(worker_ports(workers))
    ]
    return procs


def infra() -> list[Proc]:
    return [
        Proc("kafka", kafka_argv, kafka_healthy, timeout=90, prepare=kafka_prepare),
        Postgres(),
        Proc("s3", weed_argv, weed_healthy, timeout=90, prepare=weed_prepare),
    ]


def running_workers() -> list[Proc]:
    return [service(p.stem, 0) for p in sorted((STACK / "run").glob("worker-*.pid"))]


def bootstrap() -> None:
    """Topics, buckets and the database schema; idempotent."""
    run([str(VENV_PY), "-m", "evalstream.common.bootstrap"], cwd=ROOT, env={**os.environ, **client_env()})


def up(workers: int, infra_only: bool) -> None:
    t0 = time.monotonic()
    install_apt()
    kafka_libs()
    weed_binary()
    STACK.mkdir(parents=True, exist_ok=True)
    procs = infra()
    prometheus = Proc(
        "prometheus",
        prometheus_argv,
        lambda: http_ok(f"http://127.0.0.1:{PROM_PORT}/-/ready"),
        timeout=60,
        prepare=lambda: prometheus_prepare(workers),
    )
    started = [p.name for p in procs if p.start()]
    for p in procs:
        p.wait_healthy()
    bootstrap()
    if prometheus.start():
        started.append("prometheus")
    else:
        write_worker_targets(workers)
    prometheus.wait_healthy()
    if not infra_only:
        svcs = services(workers)
        # Scale down: workers beyond the requested count are stopped (they drain first).
        for extra in running_workers()[workers:]:
            extra.stop()
        started += [p.name for p in svcs if p.start()]
        for p in svcs:
            p.wait_healthy()
    what = ", ".join(started) if started else "nothing (all running)"
    log(f"up in {time.monotonic() - t0:.1f}s; started: {what}; stack folder: {STACK}")


def all_procs() -> list[Proc]:
    prometheus = Proc("prometheus", prometheus_argv, lambda: True)
    return [*running_workers(), *services(0), prometheus, *infra()]


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


def clean() -> None:
    down()
    shutil.rmtree(STACK, ignore_errors=True)
    log(f"removed {STACK}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="install on first use, start what is not running, wait until healthy")
    p_up.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "1")))
    p_up.add_argument("--infra-only", action="store_true", help="Kafka, PostgreSQL, S3 and Prometheus only")
    sub.add_parser("ps", help="list the stack's processes")
    sub.add_parser("env", help="print `export` lines that point clients (evalctl, tests) at this stack")
    sub.add_parser(
        "kafka-tools-classpath", help="the classpath of Kafka's command-line tools (fetched on first use)"
    )
    sub.add_parser("down", help="stop everything (data is kept)")
    sub.add_parser("clean", help="stop everything and delete the stack folder (data, logs)")
    p_stop = sub.add_parser("stop", help="stop one process by name")
    p_stop.add_argument("name")
    args = ap.parse_args()
    if args.cmd == "up":
        up(args.workers, args.infra_only)
    elif args.cmd == "ps":
        ps()
    elif args.cmd == "env":
        print("\n".join(f"export {k}={v}" for k, v in client_env().items()))
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
