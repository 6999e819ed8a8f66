"""docker-compose.yml's shape: the Compose Specification schema, the four services and the
infrastructure, what each builds from, restarts and waits for, healthchecks, no GPU unless the
GPU override asks for one, stop grace periods, volumes and bind mounts.

No Docker engine runs here, so this, tests/unit/test_compose_env.py,
tests/unit/test_compose_images.py and tests/unit/test_compose_prometheus.py are what check the
production-shaped path."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import yaml

from evalstream.common.settings import DEFAULTS, SERVICE_PORTS
from tests.unit.compose_files import (
    APP_SERVICES,
    COMPOSE,
    COMPOSE_FILE,
    ENV,
    ENV_EXAMPLE,
    GPU_OVERRIDE,
    RAW,
    ROOT,
    SCHEMA,
    SERVICES,
    Interpolation,
    environment,
)

INFRA = ("kafka", "postgres", "s3", "prometheus", "grafana", "bootstrap")


# --------------------------------------------------------------------------- compose: shape


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def test_compose_is_valid_against_the_compose_specification() -> None:
    assert not schema_errors(COMPOSE)
    assert not schema_errors(Interpolation(ENV).tree(yaml.safe_load(GPU_OVERRIDE.read_text())))


def test_the_schema_check_refuses_a_broken_file() -> None:
    broken = json.loads(json.dumps(COMPOSE))
    broken["services"]["worker"]["deploy"] = {"resources": {"reservations": {"devices": "gpu"}}}
    broken["services"]["router"]["healthcheck"]["interval"] = 10
    found = schema_errors(broken)
    assert any(e.startswith("services/worker/deploy/resources/reservations/devices") for e in found), found


def test_services_are_the_four_services_and_the_infrastructure() -> None:
    assert set(COMPOSE["services"]) == {*SERVICES, *INFRA}, sorted(COMPOSE["services"])
    profiles = {name: s.get("profiles") for name, s in COMPOSE["services"].items() if s.get("profiles")}
    assert not profiles, "plain `docker compose up` starts every service"


def test_every_service_builds_from_its_own_dockerfile() -> None:
    for name, svc in APP_SERVICES.items():
        build = COMPOSE["services"][name]["build"]
        assert build["context"] == ".", name
        assert build["dockerfile"] == f"ops/docker/Dockerfile.{svc}", name
        assert (ROOT / build["dockerfile"]).exists(), name
        assert COMPOSE["services"][name]["image"].startswith(f"evalstream/{svc}:"), name


def test_services_restart_and_wait_for_bootstrap() -> None:
    for name in SERVICES:
        svc = COMPOSE["services"][name]
        assert svc["restart"] == "unless-stopped", name
        assert svc["depends_on"]["bootstrap"]["condition"] == "service_completed_successfully", name
    bootstrap = COMPOSE["services"]["bootstrap"]
    assert bootstrap["command"] == ["python", "-m", "evalstream.common.bootstrap"]
    assert bootstrap.get("restart", "no") == "no"
    for infra in ("kafka", "postgres", "s3"):
        assert bootstrap["depends_on"][infra]["condition"] == "service_healthy", infra
        assert "healthcheck" in COMPOSE["services"][infra], infra


def test_healthchecks_ask_each_service_for_healthz_on_its_port() -> None:
    for name, svc in APP_SERVICES.items():
        if name == "bootstrap":
            continue
        test = " ".join(COMPOSE["services"][name]["healthcheck"]["test"])
        assert f"http://127.0.0.1:{SERVICE_PORTS[svc]}/healthz" in test, name


def _names_a_gpu(node: Any) -> list[str]:
    """Where a compose document asks for a GPU: device reservations, `gpus`, NVIDIA runtimes
    or device files, CUDA device variables."""
    found = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, child in value.items():
                if key in ("gpus", "devices", "runtime", "device_cgroup_rules") or re.search(
                    r"nvidia|CUDA_VISIBLE_DEVICES", key, re.I
                ):
                    found.append(f"{path}/{key}")
                walk(child, f"{path}/{key}")
        elif isinstance(value, list):
            for i, child in enumerate(value):
                walk(child, f"{path}/{i}")
        elif isinstance(value, str) and re.search(r"nvidia|/dev/dri|CUDA_VISIBLE_DEVICES", value, re.I):
            found.append(f"{path}: {value}")

    walk(node, "")
    return found


def test_default_compose_file_names_no_gpu_device() -> None:
    """Plain `docker compose up` must start on a host without an NVIDIA runtime."""
    assert _names_a_gpu(RAW["services"]) == []
    # the check itself finds each way of asking for one
    planted = {
        "a": {"deploy": {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": 1}]}}}},
        "b": {"gpus": "all"},
        "c": {"runtime": "nvidia"},
        "d": {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}},
    }
    for name, service in planted.items():
        assert _names_a_gpu(service), name


def test_gpu_override_reserves_a_gpu_for_the_worker_only() -> None:
    override = yaml.safe_load(GPU_OVERRIDE.read_text())
    assert set(override) == {"services"} and set(override["services"]) == {"worker"}
    devices = override["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    # the override is named where users look: the compose file's header and .env.example
    assert "docker compose -f docker-compose.yml -f docker-compose.gpu.yml up" in COMPOSE_FILE.read_text()
    assert "COMPOSE_FILE=docker-compose.yml:docker-compose.gpu.yml" in ENV_EXAMPLE.read_text()
    # bootstrap creates the work topic of the workers' group.
    group = environment(COMPOSE["services"]["worker"])["WORKER_GROUP"]
    assert environment(COMPOSE["services"]["bootstrap"])["WORKER_GROUP"] == group


def test_api_keys_and_router_settings_pass_through_env() -> None:
    from evalstream.common.providers import PRESETS

    worker = RAW["services"]["worker"]
    env = RAW["x-worker-env"]
    for preset in PRESETS.values():
        assert env[preset.key_env] == f"${{{preset.key_env}:-}}", preset.key_env
    assert env["WORKER_API_KEYS"] == "${WORKER_API_KEYS:-}"
    assert worker["env_file"] == [{"path": ".env.worker", "required": False}]
    assert "/.env.worker" in (ROOT / ".gitignore").read_text().split()
    router = RAW["services"]["router"]["environment"]
    for key in (
        "ROUTER_POLICY",
        "ROUTER_WEIGHTS",
        "ROUTER_MAX_LAG",
        "ROUTER_FALLBACK",
        "ROUTER_NO_GROUP_TIMEOUT_S",
    ):
        assert router[key] == f"${{{key}:-{DEFAULTS[key]}}}", key
    # .env.example shows each of them
    example = ENV_EXAMPLE.read_text()
    for key in ("DEEPSEEK_API_KEY", "WORKER_API_KEYS", "ROUTER_POLICY", "ROUTER_FALLBACK"):
        assert re.search(rf"^# ?{key}=", example, re.M), key


def test_stop_grace_covers_each_services_drain() -> None:
    from tests.deploy.chart import drain_seconds

    def seconds(text: str) -> float:
        parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", text)
        assert parts and text, text
        return int(parts.group(1) or 0) * 60 + int(parts.group(2) or 0)

    for name in SERVICES:
        grace = seconds(COMPOSE["services"][name]["stop_grace_period"])
        assert grace >= drain_seconds(name), name


def test_named_volumes_hold_every_stateful_service() -> None:
    expected = {
        "kafka": "kafka-data",
        "postgres": "postgres-data",
        "s3": "s3-data",
        "prometheus": "prometheus-data",
        "grafana": "grafana-data",
        "worker": "worker-models",
    }
    for name, volume in expected.items():
        sources = [str(v).split(":", 1)[0] for v in COMPOSE["services"][name].get("volumes", [])]
        assert volume in sources, name
    assert set(expected.values()) <= set(COMPOSE["volumes"])


def test_bind_mounts_exist_in_the_repository() -> None:
    for name, svc in COMPOSE["services"].items():
        for v in svc.get("volumes", []):
            source = str(v).split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source}"
