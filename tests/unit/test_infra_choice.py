"""Which infrastructure the integration and e2e suites take (tests/infra.py, `--infra`).

This machine has no Docker engine, so the containers themselves are not started here: these
tests cover the choice, the probe of the engine and the settings the containers would give.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from evalstream.common.settings import Settings
from tests import infra
from tests.support import ROOT, free_port

ENGINE = (True, "Docker engine at http+docker://localhost")
NO_ENGINE = (False, "no Docker engine at unix:///var/run/docker.sock (DockerException)")


def probes(
    local: bool, engine: tuple[bool, str]
) -> tuple[dict[str, int], Callable[[], bool], Callable[[], tuple[bool, str]]]:
    asked = {"local": 0, "engine": 0}

    def local_stack() -> bool:
        asked["local"] += 1
        return local

    def docker_engine() -> tuple[bool, str]:
        asked["engine"] += 1
        return engine

    return asked, local_stack, docker_engine


@pytest.mark.parametrize(
    ("requested", "local", "engine", "kind", "reason"),
    [
        ("auto", True, ENGINE, "local", "auto: the local stack answers"),
        ("auto", True, NO_ENGINE, "local", "auto: the local stack answers"),
        ("auto", False, ENGINE, "testcontainers", "auto: no local stack; Docker engine at"),
        ("auto", False, NO_ENGINE, "local", "auto: no Docker engine at unix:///var/run/docker.sock"),
        ("local", False, ENGINE, "local", "--infra=local"),
        ("testcontainers", True, ENGINE, "testcontainers", "--infra=testcontainers; Docker engine at"),
    ],
)
def test_choice(requested: str, local: bool, engine: tuple[bool, str], kind: str, reason: str) -> None:
    asked, local_stack, docker_engine = probes(local, engine)
    choice = infra.choose(requested, local_stack=local_stack, docker_engine=docker_engine)
    assert choice.kind == kind
    assert choice.reason.startswith(reason), choice.reason
    assert choice.describe() == f"infra: {kind} ({choice.reason})"
    # the engine is probed only when the answer depends on it
    assert asked["engine"] == (0 if requested == "local" or (requested == "auto" and local) else 1)
    assert asked["local"] == (1 if requested == "auto" else 0)


def test_testcontainers_without_an_engine_is_an_error_not_a_fallback() -> None:
    _, local_stack, docker_engine = probes(True, NO_ENGINE)
    with pytest.raises(infra.InfraUnavailable, match="--infra=testcontainers, but no Docker engine"):
        infra.choose("testcontainers", local_stack=local_stack, docker_engine=docker_engine)
    with pytest.raises(infra.InfraUnavailable, match="choose one of auto, local, testcontainers"):
        infra.choose("kind", local_stack=local_stack, docker_engine=docker_engine)


def test_engine_probe_on_a_socket_nobody_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe, through the docker client, against an address where no engine listens."""
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")
    reachable, found = infra.docker_engine()
    assert not reachable
    assert found.startswith("no Docker engine at tcp://127.0.0.1:"), found


def test_local_stack_probe_follows_the_settings() -> None:
    port = free_port()
    assert not infra.local_stack_answers(Settings(kafka_bootstrap=f"127.0.0.1:{port}"))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert infra.local_stack_answers(Settings(kafka_bootstrap=f"127.0.0.1:{server.getsockname()[1]}"))


def test_container_settings_point_every_client_at_the_published_ports() -> None:
    env = infra.container_env(
        32801,
        32802,
        32803,
        {"user": "u", "password": "p", "db": "d", "s3_access_key": "ak", "s3_secret_key": "sk"},
    )
    settings = Settings.from_env(env)
    assert settings.kafka_bootstrap == "127.0.0.1:32801"
    assert settings.database_url == "postgresql://u:p@127.0.0.1:32802/d"
    assert (settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key) == (
        "http://127.0.0.1:32803",
        "ak",
        "sk",
    )
    # the same servers as docker-compose.yml
    compose = (ROOT / "docker-compose.yml").read_text()
    for image in (infra.KAFKA_IMAGE, infra.POSTGRES_IMAGE, infra.S3_IMAGE):
        assert f"image: {image}" in compose, image


PURE_TEST = (
    "tests/unit/test_infra_choice.py::test_testcontainers_without_an_engine_is_an_error_not_a_fallback"
)


def _pytest(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", *args, PURE_TEST]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_session_header_and_summary_say_which_infrastructure_ran() -> None:
    """pytest itself, with the option: the header and the report's end name the choice, and a
    choice that cannot be had is a usage error."""
    ran = _pytest("--infra=local")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.count("infra: local (--infra=local)") == 2, ran.stdout  # header and summary
    refused = _pytest("--infra=testcontainers", env={"DOCKER_HOST": f"tcp://127.0.0.1:{free_port()}"})
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    assert "--infra=testcontainers, but no Docker engine at tcp://127.0.0.1:" in refused.stderr
