"""The bench stack: ports shifted by EVALSTREAM_PORT_OFFSET (default 4000), folder
.stack-bench/, driven through ops/local/stack.py; never the development or fault stacks."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.harness.paths import BENCH_OFFSET, FORBIDDEN_OFFSETS, PY, ROOT, STACK_PY
from bench.harness.pure import MetricKey, parse_prometheus
from evalstream.common.settings import SERVICE_PORTS, KafkaSettings

T = TypeVar("T")


def use_bench_stack() -> dict[str, str]:
    """Points this process (and the children it starts) at the bench stack and returns the
    client environment. Refuses the development and fault stacks."""
    if "EVALSTREAM_PORT_OFFSET" not in os.environ:
        # `make` exports EVALSTREAM_STACK=.stack for the dev stack: never inherit it here
        os.environ["EVALSTREAM_PORT_OFFSET"] = str(BENCH_OFFSET)
        os.environ["EVALSTREAM_STACK"] = str(ROOT / ".stack-bench")
    offset = int(os.environ["EVALSTREAM_PORT_OFFSET"])
    stack = Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack-bench")).resolve()
    if offset in FORBIDDEN_OFFSETS or stack in {
        (ROOT / ".stack").resolve(),
        (ROOT / ".stack-faults").resolve(),
    }:
        raise SystemExit(
            f"bench: refusing to run on the stack at offset {offset} ({stack}); benchmarks use their own "
            "(EVALSTREAM_PORT_OFFSET=4000 EVALSTREAM_STACK=.stack-bench)"
        )
    os.environ["EVALSTREAM_STACK"] = str(stack)
    env = client_env()
    os.environ.update(env)
    return env


def offset() -> int:
    return int(os.environ.get("EVALSTREAM_PORT_OFFSET", BENCH_OFFSET))


def stack_dir() -> Path:
    return Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack-bench"))


def client_env(principal: str = "user") -> dict[str, str]:
    """`stack.py env`: the bench stack's endpoints with the Kafka credentials of `principal`
    (a service's name for a service, "user" for clients)."""
    out = subprocess.run(
        [sys.executable, str(STACK_PY), "env", "--principal", principal],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    env = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        if key:
            env[key.strip()] = shlex.split(value)[0] if value.strip() else ""  # stack.py quotes values
    return env


def stack(*args: str, env: Mapping[str, str] | None = None, quiet: bool = True) -> None:
    """ops/local/stack.py ARGS on the bench stack; `env` reaches the services it starts."""
    proc = subprocess.run(
        [str(PY), str(STACK_PY), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=quiet,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"stack.py {' '.join(args)} failed:\n{(proc.stdout or '')[-3000:]}{(proc.stderr or '')[-3000:]}"
        )


def ensure_up(
    worker_env: Mapping[str, str] | None = None, workers: int = 1, routers: int = 1, aggregators: int = 1
) -> None:
    """Brings the bench stack up with `workers` workers, `routers` routers and `aggregators`
    aggregators (beyond those, running ones are stopped). With `worker_env`, (re)starts the
    workers with it; without, workers left with other settings by an earlier benchmark are
    restarted with the defaults."""
    want = dict(worker_env or {})
    if worker_env_now() != want:
        for p in sorted((stack_dir() / "run").glob("worker-*.pid")):
            stack("stop", p.stem)
    shape = {"workers": workers, "routers": routers, "aggregators": aggregators}
    stack("up", *_shape_args(shape), env=want)
    set_worker_env(want)
    _shape_marker().write_text(json.dumps(shape))


def _shape_marker() -> Path:
    return stack_dir() / "run" / "bench-shape.json"


def _shape_args(shape: Mapping[str, int]) -> list[str]:
    return [a for kind, n in shape.items() for a in (f"--{kind}", str(n))]


def shape_now() -> dict[str, int]:
    """The topology ensure_up last brought up (1 of each: the default)."""
    marker = _shape_marker()
    return (
        dict(json.loads(marker.read_text()))
        if marker.exists()
        else {"workers": 1, "routers": 1, "aggregators": 1}
    )


def topology(workers: int = 1, routers: int = 1, aggregators: int = 1) -> list[str]:
    """The service processes' names of that topology (as their pid files name them)."""
    return [
        "producer",
        *(["router"] + [f"router-{i}" for i in range(1, routers)]),
        *(f"worker-{i}" for i in range(workers)),
        *(["aggregator"] + [f"aggregator-{i}" for i in range(1, aggregators)]),
    ]


def _worker_marker() -> Path:
    return stack_dir() / "run" / "bench-worker-env.json"


def worker_env_now() -> dict[str, str]:
    """The settings a benchmark last started the worker with ({}: the defaults)."""
    marker = _worker_marker()
    return dict(json.loads(marker.read_text())) if marker.exists() else {}


def set_worker_env(env: Mapping[str, str]) -> None:
    _worker_marker().parent.mkdir(parents=True, exist_ok=True)
    _worker_marker().write_text(json.dumps(dict(env)))


def reset_stack() -> None:
    """Deletes the bench stack's data (Kafka topics, database, objects) and brings it up
    afresh with the default worker: the way out of a run that cannot finish. The new stack
    has new credentials: this process's client environment takes them (use_bench_stack)."""
    stack("clean")
    stack("up")
    set_worker_env({})
    os.environ.update(client_env())


def restart(
    names: Sequence[str],
    env: Mapping[str, str] | None = None,
    while_stopped: Callable[[], T] | None = None,
) -> T | None:
    """Stops the named services and brings the stack up again (resets their peak RSS).
    `env` applies to what is restarted; the worker keeps the settings ensure_up gave it.
    `while_stopped` runs between (a measurement of the machine without the services): its
    value is returned."""
    for name in names:
        stack("stop", name)
    measured = while_stopped() if while_stopped is not None else None
    stack("up", *_shape_args(shape_now()), env={**worker_env_now(), **(env or {})})
    return measured


REPLICA_PORT_BASE = {"router": 8120, "aggregator": 8130}  # as ops/local/localstack/prometheus.py


def service_port(name: str) -> int:
    base, _, index = name.partition("-")
    if base == "worker":
        return SERVICE_PORTS[base] + int(index) + offset()
    if index:  # router-1, aggregator-2, ...
        return REPLICA_PORT_BASE[base] + int(index) + offset()
    return SERVICE_PORTS[base] + offset()


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def metrics(name: str) -> dict[MetricKey, float]:
    """The Prometheus samples a service exposes right now."""
    return parse_prometheus(http_get(f"http://127.0.0.1:{service_port(name)}/metrics"))


def kafka_settings(principal: str = "user") -> KafkaSettings:
    """The bench stack's Kafka with the credentials of `principal` (client_env)."""
    return KafkaSettings.from_env(client_env(principal))


async def group_state(group: str, kafka: KafkaSettings) -> tuple[str, int, int]:
    """(state, members, members holding a partition) of a consumer group, asked with
    credentials allowed to describe it (clients may describe the worker groups; a service,
    its own group)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.group import MemberAssignment

    from evalstream.common.kafka_security import client_kwargs

    admin = AIOKafkaAdminClient(**client_kwargs(kafka))
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    for response in described:
        for g in response.groups:
            # (error, group id, state, protocol type, protocol, members, ...); each member's
            # assignment is the last field, in the consumer protocol's encoding
            members = g[5]
            holding = sum(1 for m in members if m[-1] and MemberAssignment.decode(m[-1]).assignment)
            return g[2], len(members), holding
    return "Dead", 0, 0


def wait_groups_settled(expected: Mapping[str, tuple[str, int, int]], timeout: float = 120) -> float:
    """Seconds until each consumer group (-> the principal that may describe it, members,
    members holding a partition) is Stable with those members and holders. A service restarted a moment ago joins its group a few seconds
    later (at the others' next heartbeat): a run measured before that pays a rebalance of
    every member mid-way, which no running stack does."""
    t0 = time.monotonic()
    kafka = {principal: kafka_settings(principal) for principal, *_ in expected.values()}
    while True:
        states = {g: asyncio.run(group_state(g, kafka[principal])) for g, (principal, *_) in expected.items()}
        if all(state == ("Stable", *expected[g][1:]) for g, state in states.items()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"consumer groups never settled: {states}, expected {dict(expected)}")
        time.sleep(0.2)


def wait_http(url: str, timeout: float) -> float:
    """Seconds until `url` answers 2xx."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            http_get(url, timeout=1.0)
            return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def log_records(log: Path, since: int) -> Iterator[dict[str, Any]]:
    """The records a service logged (JSON lines) since byte `since`; other lines skipped."""
    if not log.exists():
        return
    with log.open("rb") as f:
        f.seek(since)
        for raw in f:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                yield rec


def logged_errors(log: Path, since: int) -> dict[str, int]:
    """Error messages (by exception type) a service logged since byte `since`."""
    out: dict[str, int] = {}
    for rec in log_records(log, since):
        if rec.get("level") == "ERROR":
            exc = str(rec.get("exc") or rec.get("msg") or "")
            last = exc.strip().splitlines()[-1] if exc.strip() else "?"
            key = last.split(":")[0][:80]
            out[key] = out.get(key, 0) + 1
    return out
