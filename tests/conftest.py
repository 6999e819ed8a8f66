"""Shared fixtures. Tests marked `stack` talk to the real local stack (`make up`), which
`make test` brings up before pytest starts; they fail (not skip) when it is missing."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common.settings import Settings
from tests import infra
from tests.support import ServiceProcess, admin_database_url, admin_kafka, free_port


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Settings:
    """Asserts that the stack's infrastructure answers; returns its settings."""
    host, port = settings.kafka_bootstrap.split(":")
    with socket.socket() as s:
        s.settimeout(2)
        if s.connect_ex((host, int(port))) != 0:
            pytest.fail("the local stack is not running: run `make up` (make test does it for you)")
    return settings


@pytest.fixture
async def pg(stack: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the users' role (what evalctl reads with): it reads, never writes."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def pg_admin(stack: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the tables' owner: for setting up, changing or removing rows."""
    conn = await asyncpg.connect(admin_database_url())
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def kafka_producer(stack: Settings) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(**admin_kafka(), acks="all")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    """spawn(module, **env) -> (ServiceProcess, port): a service with a free HTTP port."""
    procs: list[ServiceProcess] = []

    def _spawn(module: str, **env: str) -> tuple[ServiceProcess, int]:
        port = free_port()
        p = ServiceProcess(
            module,
            {"HTTP_PORT": str(port), "PYTHONUNBUFFERED": "1", **env},
            tmp_path / f"{module.split('.')[-1]}-{len(procs)}.log",
        ).start()
        procs.append(p)
        return p, port

    yield _spawn
    for p in procs:
        p.stop()
        # pytest shows captured output only when the test fails: then the services' own
        # account of what happened is right there (CI keeps no tmp_path).
        if p.log.exists():
            print(f"----- {p.module} ({p.log}), last lines -----\n{p.log.read_text()[-6000:]}")


# --------------------------------------------------------------------------- infrastructure
# Kafka, PostgreSQL and S3 for the integration and e2e suites: the local stack or
# testcontainers (tests/infra.py); the session header and the report's end say which.

INFRA = pytest.StashKey[infra.Choice]()
NEEDS_INFRA = ("integration", "e2e")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--infra",
        choices=infra.CHOICES,
        default=os.environ.get("EVALSTREAM_TEST_INFRA", "auto"),
        help="where integration/e2e tests get Kafka, PostgreSQL and S3: the local stack (make up), "
        "testcontainers (needs a Docker engine), or auto: the local stack if it answers, else "
        "testcontainers if an engine answers, else the local stack (default; EVALSTREAM_TEST_INFRA)",
    )


def pytest_configure(config: pytest.Config) -> None:
    try:
        config.stash[INFRA] = infra.choose(
            config.getoption("--infra"),
            local_stack=infra.local_stack_answers,
            docker_engine=infra.docker_engine,
        )
    except infra.InfraUnavailable as exc:
        raise pytest.UsageError(str(exc)) from exc


def pytest_report_header(config: pytest.Config) -> str:
    return config.stash[INFRA].describe()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With testcontainers, the containers and services start once, if a selected test needs them."""
    if config.stash[INFRA].kind != "testcontainers":
        return
    if not any(item.get_closest_marker("stack") or set(NEEDS_INFRA) & set(item.path.parts) for item in items):
        return
    started = infra.start_containers(config.rootpath / ".stack-testcontainers" / "logs")
    config.add_cleanup(started.stop)
    os.environ.update(started.env)  # Settings.from_env() in the fixtures and the spawned services


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    terminalreporter.write_line(config.stash[INFRA].describe())
