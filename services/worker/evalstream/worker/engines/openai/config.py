"""The `openai:` engine's configuration: a SPEC's options (parsed and bounded by
evalstream.common.specs), else its provider preset's, else the worker's environment, else the
default:

    concurrency  OPENAI_CONCURRENCY  8    most requests in flight: the adaptive limit's ceiling (<= 64)
    rps          OPENAI_RPS          0    requests per second (0: unlimited)
    rpm          OPENAI_RPM          0    requests per minute (0: unlimited)
    timeout      OPENAI_TIMEOUT_S    60   seconds for one HTTP request, connecting to last byte (<= 120)
    retries      OPENAI_MAX_RETRIES  6    retries of one request before the item fails (<= 8)

Options written in the SPEC are part of it, and so of the answer-cache key; set them in the
worker's environment instead to share cached answers between runs with different limits.
The lower bounds checked here are the SPEC table's (specs.OPENAI_OPTIONS), so that an
operator's OPENAI_* setting cannot go below what a SPEC may say.

API keys: a job never chooses which variable a worker reads. The operator maps endpoints to
variables in WORKER_API_KEYS, comma-separated `<base-url pattern>=<VARIABLE>` pairs, e.g.

    WORKER_API_KEYS="https://api.deepseek.com/*=DEEPSEEK_API_KEY,http://10.0.0.5:8000/*=VLLM_KEY"

The first pattern (shell-style, matched on the parsed base URL plus a trailing "/") that
matches decides the variable; else a provider preset's own variable, for the preset's own URL;
an endpoint neither covers gets no key at all. Which endpoints a group may call at all is its
allow-list's business (WORKER_MODEL, e.g. `openai:*@https://api.deepseek.com/*`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from evalstream.common import providers
from evalstream.common.settings import OpenAISettings
from evalstream.common.specs import OPENAI_OPTIONS, ModelSpec, SpecError, parse_model_spec

MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a chat completion is a few KB; more is an error


class OpenAIConfigError(ValueError):
    """A bad `openai:` SPEC, option or WORKER_API_KEYS entry."""


@dataclass(frozen=True)
class OpenAIConfig:
    model: str
    base_url: str  # up to and including the API version, e.g. https://api.deepseek.com/v1
    concurrency: int = OpenAISettings.openai_concurrency
    rps: float = OpenAISettings.openai_rps
    rpm: float = OpenAISettings.openai_rpm
    timeout_s: float = OpenAISettings.openai_timeout_s
    max_retries: int = OpenAISettings.openai_max_retries
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    max_retry_after_s: float = 120.0  # a longer Retry-After fails the item now (eval.retry waits)
    max_response_bytes: int = MAX_RESPONSE_BYTES
    # A provider preset's key variable (providers.py: code, never a job's choice), used for the
    # preset's own base URL when WORKER_API_KEYS maps none.
    key_env: str | None = None


def openai_config(spec: ModelSpec, env: Mapping[str, str] | None = None) -> OpenAIConfig:
    """The engine's configuration for a parsed `openai:` SPEC: its options (bounded by the
    parser), else its provider preset's, else the operator's (OPENAI_* settings, read from
    `env`, default the process environment)."""
    if spec.scheme != "openai":
        raise OpenAIConfigError(f"not an openai: SPEC: {spec.text!r}")
    try:
        operator = OpenAISettings.from_env(env)
    except ValueError as exc:
        raise OpenAIConfigError(f"worker setting: {exc}") from None
    preset = providers.PRESETS[spec.preset] if spec.preset else None
    preset_values = preset.options() if preset else {}
    values: dict[str, Any] = {}
    for bound in OPENAI_OPTIONS.values():
        value = getattr(spec.options, bound.field)
        if value is None:
            value = preset_values.get(bound.field)
        if value is None:
            value = getattr(operator, bound.env.lower())
        values[bound.field] = bound.kind(value)
    config = OpenAIConfig(
        model=spec.target, base_url=spec.base_url, key_env=preset.key_env if preset else None, **values
    )
    problems = [f"{name} must be >= {low}" for name, low in _MINIMUMS.items() if getattr(config, name) < low]
    if problems:
        raise OpenAIConfigError("; ".join(problems))
    return config


# the SPEC table's lower bounds, by OpenAIConfig field
_MINIMUMS = {bound.field: bound.low for bound in OPENAI_OPTIONS.values()}


def parse_target(target: str, env: Mapping[str, str] | None = None) -> OpenAIConfig:
    """`<model>@<base_url>[?options]` (what follows "openai:") -> config. Raises OpenAIConfigError."""
    try:
        parsed = parse_model_spec(f"openai:{target}")
    except SpecError as exc:
        raise OpenAIConfigError(str(exc)) from None
    return openai_config(parsed, env)


def parse_key_rules(rules: str) -> list[tuple[str, str]]:
    """WORKER_API_KEYS -> [(base-url pattern, variable)]. Raises OpenAIConfigError."""
    out: list[tuple[str, str]] = []
    for entry in (e.strip() for e in rules.split(",")):
        if not entry:
            continue
        pattern, eq, variable = entry.rpartition("=")
        if not eq or not pattern.strip() or not _ENV_NAME.fullmatch(variable.strip()):
            raise OpenAIConfigError(
                f"WORKER_API_KEYS entry {entry!r}: expected <base-url pattern>=<VARIABLE_NAME>"
            )
        out.append((pattern.strip(), variable.strip()))
    return out


def key_variable(rules: str, base_url: str) -> str | None:
    """The variable holding the key for `base_url` per WORKER_API_KEYS, or None: no key."""
    for pattern, variable in parse_key_rules(rules):
        if fnmatchcase(base_url + "/", pattern) or fnmatchcase(base_url, pattern):
            return variable
    return None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
