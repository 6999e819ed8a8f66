"""Helpers for tests that talk to the real stack (importable as tests.support)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiokafka import AIOKafkaConsumer

from evalstream.common import storage
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.lag import topic_partitions
from evalstream.common.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
STACK = Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack"))


def stack_cmd(*args: str, env: dict[str, str] | None = None) -> None:
    """`ops/local/stack.py ARGS` for the stack the tests run against (stop, up, ...)."""
    subprocess.run(
        [sys.executable, "ops/local/stack.py", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, **(env or {})},
    )


PROMETHEUS_URL = os.environ.get("PROMETHEUS_URL", "http://127.0.0.1:9090")

# The Kafka settings a client's credentials consist of (libs/common settings.KafkaSettings).
KAFKA_CREDENTIALS = ("KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM", "KAFKA_USERNAME", "KAFKA_PASSWORD")
# ... and those of the stores: a principal's database role (db_roles.py) and S3 key pair
# (s3_identities.py).
STORE_CREDENTIALS = ("DATABASE_URL", "S3_ACCESS_KEY", "S3_SECRET_KEY")

# --------------------------------------------------------------------------- hosts (stack.py up --hosts N)


def stack_hosts(at_least: int) -> dict[str, Any]:
    """The stack's hosts' network as `stack.py up --hosts N` described it (hosts.json):
    addresses, namespaces, links, worker groups, the fault proxy. Fails, with the command to
    run, on a stack with fewer than `at_least` hosts."""
    path = STACK / "hosts.json"
    described = json.loads(path.read_text()) if path.exists() else {"machines": []}
    if len(described["machines"]) < at_least:
        raise AssertionError(
            f"this test needs a stack with at least {at_least} hosts; it has {len(described['machines'])}:"
            f" run `ops/local/stack.py up --hosts {at_least}` (make up HOSTS={at_least})"
        )
    return described


def host_env(host: str, via_proxy: bool = False) -> dict[str, str]:
    """The environment a process on `host` gets (`stack.py env --host`): the stack's settings
    and credentials with every endpoint on the hosts' network (Kafka via the fault proxy)."""
    args = [
        sys.executable,
        "ops/local/stack.py",
        "env",
        "--host",
        host,
        *(["--via-proxy"] if via_proxy else []),
    ]
    out = subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env


def netns_of(pid: int) -> int:
    """The inode of a process's network namespace (equal inodes: the same network)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def on_the_local_stack() -> bool:
    """Whether the tests run against the local stack (`make up`), whose principals each have
    their own credentials; testcontainers' infrastructure has one set for everything (its
    broker does not authenticate: KAFKA_SECURITY_PROTOCOL unset or PLAINTEXT)."""
    return os.environ.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper() != "PLAINTEXT"


@functools.cache
def credentials_env(principal: str) -> dict[str, str]:
    """Every credential of `principal` on the test stack (`stack.py env --principal`): its
    Kafka principal, database role and S3 key pair. "admin" is the broker's super user, the
    tables' owner and the store's admin; a service's name is that service's; "user" is what
    `stack.py env` gives the tests themselves (whose role reads the database, never writes it).
    Empty where the infrastructure has one set of credentials (testcontainers)."""
    if not on_the_local_stack():
        return {}
    out = subprocess.run(
        [sys.executable, "ops/local/stack.py", "env", "--principal", principal],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    env = {}
    for line in out.splitlines():
        key, sep, value = line.removeprefix("export ").partition("=")
        if sep:
            env[key] = shlex.split(value)[0] if value else ""
    return {k: v for k, v in env.items() if k in (*KAFKA_CREDENTIALS, *STORE_CREDENTIALS)}


def kafka_env(principal: str) -> dict[str, str]:
    """The Kafka credentials of `principal` (credentials_env)."""
    return {k: v for k, v in credentials_env(principal).items() if k in KAFKA_CREDENTIALS}


def principal_settings(principal: str) -> Settings:
    """The tests' settings with every credential of `principal`."""
    return Settings.from_env({**os.environ, **credentials_env(principal)})


def admin_settings() -> Settings:
    """Settings of the admin: for tests that create topics, read any topic or forge the
    messages of a service (the users' principal may only publish jobs), set up or change rows
    in the database (the users' role only reads), or write anywhere in the store."""
    return principal_settings("admin")


def admin_kafka() -> dict[str, Any]:
    """aiokafka client arguments (bootstrap servers and credentials) of the admin principal."""
    return client_kwargs(admin_settings())


def admin_database_url() -> str:
    """DATABASE_URL of the tables' owner: for tests that insert, update or delete rows."""
    return admin_settings().database_url


def service_env(module: str) -> dict[str, str]:
    """The credentials a service module (evalstream.worker, evalstream.router.app, ...) runs
    with: its own principal, database role and S3 key pair, as the local stack starts it."""
    parts = module.split(".")
    return credentials_env(parts[1]) if len(parts) > 1 and parts[0] == "evalstream" else {}


def same_endpoint(url: str, endpoint_of: str) -> str:
    """`url` (its user and password) at the host and port of `endpoint_of`."""
    parts, where = urlsplit(url), urlsplit(endpoint_of)
    userinfo = parts.netloc.rpartition("@")[0]
    host = where.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host))


def service_database_url(service: str) -> str:
    """DATABASE_URL of a service's own role: for tests that run a service's code in-process."""
    return principal_settings(service).database_url


async def topic_end_offsets(topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(**admin_kafka(), request_timeout_ms=10_000)
    await consumer.start()
    try:
        tps = await topic_partitions(consumer, topic)
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


async def read_records(
    topic: str, start: dict[int, int], end: dict[int, int] | None = None, timeout: float = 120
) -> list[Any]:
    """Every record of `topic` from `start` up to `end` (default: the end now), per partition."""
    consumer = AIOKafkaConsumer(**admin_kafka(), enable_auto_commit=False)
    await consumer.start()
    out: list[Any] = []
    try:
        tps = await topic_partitions(consumer, topic)
        consumer.assign(tps)
        now = {tp.partition: off for tp, off in (await consumer.end_offsets(tps)).items()}
        ends = {p: min(off, (end or now).get(p, off)) for p, off in now.items()}
        for tp in tps:
            consumer.seek(tp, start.get(tp.partition, 0))
        deadline = time.monotonic() + timeout
        while any([await consumer.position(tp) < ends.get(tp.partition, 0) for tp in tps]):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} took more than {timeout}s")
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                out += [r for r in records if r.offset < ends.get(r.partition, 0)]
    finally:
        await consumer.stop()
    return out


async def read_topic_since(
    topic: str, start: dict[int, int]
) -> list[tuple[bytes | None, bytes, dict[str, bytes]]]:
    """(key, value, headers) of every record of `topic` after the offsets in `start` (as
    returned by topic_end_offsets)."""
    return [(r.key, r.value or b"", dict(r.headers)) for r in await read_records(topic, start)]


def upload_dataset(settings: Settings, path: Path) -> str:
    """`path` uploaded where `evalctl submit` puts datasets, as the s3:// URI a job names: the
    producer reads no local file a job names."""
    data = path.read_bytes()
    key = f"uploads/{hashlib.sha256(data).hexdigest()}/{path.name}"
    storage.put_bytes(
        storage.client(settings), settings.s3_bucket_datasets, key, data, "application/x-ndjson"
    )
    return f"s3://{settings.s3_bucket_datasets}/{key}"


class ServiceProcess:
    """A service started by a test, with its own log and the credentials of its own
    principal (the service's, as the local stack starts it); stopped (SIGTERM) at
    teardown. With `netns`, it runs in that network namespace (a host of
    `stack.py up --hosts`) and is reached at `address`."""

    def __init__(
        self,
        module: str,
        env: dict[str, str],
        log: Path,
        netns: str | None = None,
        address: str = "127.0.0.1",
    ) -> None:
        self.module, self.env, self.log = module, env, log
        self.netns, self.address = netns, address
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = self.log.open("ab")
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []  # it execs: same pid
        credentials = service_env(self.module)
        if self.env.get("DATABASE_URL") and credentials.get("DATABASE_URL"):
            # the service's own role, at the address this process reaches the database by
            # (a host's processes: the infrastructure's address on the hosts' network)
            credentials["DATABASE_URL"] = same_endpoint(credentials["DATABASE_URL"], self.env["DATABASE_URL"])
        self.proc = subprocess.Popen(
            [*inside, sys.executable, "-m", self.module],
            env={**os.environ, **self.env, **credentials},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_healthy(self, port: int, timeout: float = 120.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.module} exited with {self.proc.returncode}; log {self.log}:\n"
                    + self.log.read_text()[-3000:]
                )
            try:
                with urllib.request.urlopen(f"http://{self.address}:{port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{self.module} not ready in {timeout}s; log {self.log}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGUSR2)  # every thread's stack into its log (service.run)
            time.sleep(1.0)
            self.signal(signal.SIGKILL)
            return self.proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def wait_until(predicate, timeout: float, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def duckdb_delta(s3: Any = None) -> Any:
    """A DuckDB connection that reads Delta tables: the delta (and httpfs) extensions come
    from their PyPI packages (duckdb-ext-*), not from DuckDB's download site. With `s3`
    (Settings), an S3 secret for the stack's store, as the README's query creates it."""
    import duckdb
    import duckdb_ext  # namespace package of the duckdb-ext-* wheels: the extension files

    con = duckdb.connect(
        config={
            "extension_directory": f"{next(iter(duckdb_ext.__path__))}/extensions",
            "autoinstall_known_extensions": False,
        }
    )
    con.execute("LOAD delta")
    if s3 is not None:
        con.execute("LOAD httpfs")
        con.execute(duckdb_s3_secret(s3))
    return con


def duckdb_s3_secret(s3: Any) -> str:
    """The README's CREATE SECRET for the stack's S3 store."""
    endpoint = s3.s3_endpoint.split("://", 1)[1]
    return (
        f"CREATE OR REPLACE SECRET evalstream (TYPE s3, KEY_ID '{s3.s3_access_key}', SECRET '{s3.s3_secret_key}',"
        f" REGION '{s3.s3_region}', ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL {str(s3.s3_endpoint.startswith('https')).lower()})"
    )


def wandb_records(path: Path) -> list[Any]:
    """The protobuf Records of a W&B offline run file (`run-<id>.wandb`): a LevelDB-style log
    (7-byte file header, 32 KiB blocks, 7-byte record headers: crc, length, type) that
    wandb no longer ships a Python reader for."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, pos, pending, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def sample_path(name: str = "demo.jsonl") -> Path:
    """A sample dataset the producer ships (`demo.jsonl`, `demo_code.jsonl`: `make demo` runs them)."""
    return ROOT / "services" / "producer" / "evalstream" / "producer" / "samples" / name
