"""What the Compose and image tests (tests/unit/test_compose_*.py) read, and how: the
repository's files, docker-compose.yml as Compose interpolates it with .env.example, and the
local stack's module (ops/local/stack.py) and the image lock script (ops/docker/lock_images.py),
loaded from their files."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"
# The Compose Specification's schema, vendored from compose-go (tests/deploy/schemas/README.md).
SCHEMA = ROOT / "tests/deploy/schemas/compose-spec.json"
DOCKER = ROOT / "ops/docker"
PROMETHEUS = ROOT / "ops/prometheus"

SERVICES = ("producer", "router", "worker", "aggregator")


# compose service -> the evalstream service whose image, settings and port it uses
APP_SERVICES = {
    "producer": "producer",
    "router": "router",
    "worker": "worker",
    "aggregator": "aggregator",
    "bootstrap": "producer",
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
