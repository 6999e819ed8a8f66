"""Shared fixtures. Tests marked `stack` talk to the real local stack (`make up`), which
`make test` brings up before pytest starts; they fail (not skip) when it is missing."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from evalstream.common.settings import Settings
from tests.support import ServiceProcess, free_port


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
    conn = await asyncpg.connect(stack.database_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def kafka_producer(stack: Settings) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka_bootstrap, acks="all")
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
