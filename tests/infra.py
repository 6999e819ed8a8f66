"""Where the integration and e2e suites take Kafka, PostgreSQL and S3 from:

* `local`: the local stack (`make up`, ops/local/stack.py), whose endpoints the settings name;
* `testcontainers`: containers started for the session on a reachable Docker engine (the
  images docker-compose.yml runs: apache/kafka, postgres, SeaweedFS), with the four services
  started as processes against them (Prometheus is the local stack's only).

`pytest --infra=auto|local|testcontainers` (default auto): auto takes the local stack when it
answers, else testcontainers when a Docker engine answers, else the local stack (whose
fixtures then fail saying to run `make up`). The choice and its reason are in the session
header and at the end of the report.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalstream.common.settings import SERVICE_PORTS, Settings
from tests.replay_files import replay_env
from tests.support import ROOT, ServiceProcess, free_port

CHOICES = ("auto", "local", "testcontainers")
# The infrastructure images of docker-compose.yml, so both paths run the same servers.
KAFKA_IMAGE = "apache/kafka:4.4.0"
POSTGRES_IMAGE = "postgres:17"
S3_IMAGE = "chrislusf/seaweedfs:4.53"


class InfraUnavailable(Exception):
    """The infrastructure asked for cannot be had (e.g. --infra=testcontainers, no engine)."""


@dataclass(frozen=True)
class Choice:
    kind: str  # "local" | "testcontainers"
    reason: str

    def describe(self) -> str:
        return f"infra: {self.kind} ({self.reason})"


def choose(
    requested: str,
    *,
    local_stack: Callable[[], bool],
    docker_engine: Callable[[], tuple[bool, str]],
) -> Choice:
    """The infrastructure for this session. `local_stack()`: whether the local stack's Kafka
    answers; `docker_engine()`: (reachable, what was found). Each is asked only when needed."""
    if requested not in CHOICES:
        raise InfraUnavailable(f"--infra={requested}: choose one of {', '.join(CHOICES)}")
    if requested == "local":
        return Choice("local", "--infra=local")
    if requested == "testcontainers":
        reachable, found = docker_engine()
        if not reachable:
            raise InfraUnavailable(f"--infra=testcontainers, but {found}")
        return Choice("testcontainers", f"--infra=testcontainers; {found}")
    if local_stack():
        return Choice("local", "auto: the local stack answers")
    reachable, found = docker_engine()
    if reachable:
        return Choice("testcontainers", f"auto: no local stack; {found}")
    return Choice("local", f"auto: {found}; the local stack (`make up`)")


def local_stack_answers(settings: Settings | None = None) -> bool:
    bootstrap = (settings or Settings.from_env()).kafka_bootstrap.split(",")[0]
    host, _, port = bootstrap.rpartition(":")
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) == 0


def docker_engine() -> tuple[bool, str]:
    """Whether a Docker engine answers (DOCKER_HOST, else the default socket)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
    except Exception as exc:  # no socket, no permission, a dead daemon: all mean "none here"
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return False, f"no Docker engine at {where} ({type(exc).__name__})"
    return True, f"Docker engine at {client.api.base_url}"


# --------------------------------------------------------------------------- testcontainers


@dataclass
class Containers:
    """The session's containers and service processes; `env` is how tests reach them."""

    env: dict[str, str] = field(default_factory=dict)
    containers: list[Any] = field(default_factory=list)
    services: list[ServiceProcess] = field(default_factory=list)

    def stop(self) -> None:
        for proc in reversed(self.services):
            proc.stop()
        for container in reversed(self.containers):
            container.stop()


def container_env(
    kafka_port: int, postgres_port: int, s3_port: int, credentials: dict[str, str]
) -> dict[str, str]:
    """The settings that point services and tests at the containers' published ports."""
    user, password, db = credentials["user"], credentials["password"], credentials["db"]
    return {
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        "DATABASE_URL": f"postgresql://{user}:{password}@127.0.0.1:{postgres_port}/{db}",
        "S3_ENDPOINT": f"http://127.0.0.1:{s3_port}",
        "S3_ACCESS_KEY": credentials["s3_access_key"],
        "S3_SECRET_KEY": credentials["s3_secret_key"],
    }


def start_containers(logs: Path) -> Containers:
    """Kafka, PostgreSQL and S3 in containers, the schema/topics/buckets, then the four
    services as processes (ports: SERVICE_PORTS shifted by EVALSTREAM_PORT_OFFSET, as the
    tests expect)."""
    from testcontainers.community.postgres import PostgresContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import HttpWaitStrategy, LogMessageWaitStrategy

    defaults = Settings()
    credentials = {
        "user": "evalstream",
        "password": "evalstream",
        "db": "evalstream",
        "s3_access_key": defaults.s3_access_key,
        "s3_secret_key": defaults.s3_secret_key,
    }
    started = Containers()
    try:
        # Kafka advertises the host port it is published on, so it is chosen first.
        kafka_port = free_port()
        kafka = (
            DockerContainer(KAFKA_IMAGE)
            .with_bind_ports(9092, kafka_port)
            .with_env("KAFKA_NODE_ID", "1")
            .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
            .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9093")
            .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
            .with_env("KAFKA_LISTENERS", "PLAINTEXT://:9092,CONTROLLER://:9093")
            .with_env("KAFKA_ADVERTISED_LISTENERS", f"PLAINTEXT://127.0.0.1:{kafka_port}")
            .with_env("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT")
            .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR", "1")
            .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
            .waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(120))
        )
        started.containers.append(kafka.start())
        postgres = PostgresContainer(
            POSTGRES_IMAGE,
            username=credentials["user"],
            password=credentials["password"],
            dbname=credentials["db"],
        )
        started.containers.append(postgres.start())
        s3 = (
            DockerContainer(S3_IMAGE)
            .with_command("server -ip.bind=0.0.0.0 -s3 -s3.port=8333")
            .with_env("AWS_ACCESS_KEY_ID", credentials["s3_access_key"])
            .with_env("AWS_SECRET_ACCESS_KEY", credentials["s3_secret_key"])
            .with_exposed_ports(8333)
            .waiting_for(HttpWaitStrategy(8333, "/healthz").with_startup_timeout(120))
        )
        started.containers.append(s3.start())
        started.env = container_env(
            kafka_port,
            int(postgres.get_exposed_port(5432)),
            int(s3.get_exposed_port(8333)),
            credentials,
        )
        env = {**os.environ, **started.env}
        subprocess.run(
            [sys.executable, "-m", "evalstream.common.bootstrap"], cwd=ROOT, env=env, check=True, timeout=300
        )
        offset = int(os.environ.get("EVALSTREAM_PORT_OFFSET", "0"))
        for name in ("producer", "router", "aggregator", "worker"):
            port = SERVICE_PORTS[name] + offset
            proc = ServiceProcess(
                f"evalstream.{name}",
                {**started.env, **replay_env(), "HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1"},
                logs / f"{name}.log",
            ).start()
            started.services.append(proc)
            proc.wait_healthy(port, timeout=300)
    except BaseException:
        started.stop()
        raise
    return started
