"""What a job may name: model SPECs and graders. Checked by the producer (which must not
load a model to reject a typo) and honoured by workers."""

from __future__ import annotations

from fnmatch import fnmatchcase

DEFAULT_MODEL = "hf:smollm2-135m-instruct"
BUNDLED_MODELS = ("smollm2-135m-instruct",)
SCHEMES = ("hf", "openai", "replay", "null")

# Grader names a job may ask for; "auto" picks one per item (code, choices, number, text).
GRADER_NAMES = ("auto", "exact", "numeric", "multiple_choice", "code_exec")


def spec_problem(spec: str) -> str | None:
    """Why `spec` is not a model SPEC, or None if it is well-formed."""
    if spec == "null":
        return None
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in SCHEMES or scheme == "null":
        return f"unknown model SPEC {spec!r}: expected hf:<dir|file.gguf|bundled name>, openai:<model>@<url>, replay:<file.jsonl> or null"
    if not rest:
        return f"model SPEC {spec!r} names no model"
    if scheme == "hf" and "/" not in rest and not rest.endswith(".gguf") and rest not in BUNDLED_MODELS:
        return f"unknown bundled model {rest!r} (bundled: {', '.join(BUNDLED_MODELS)}); give a directory or a .gguf file"
    if scheme == "openai":
        model, at, url = rest.partition("@")
        if not model or not at or not url.startswith(("http://", "https://")):
            return f"model SPEC {spec!r}: expected openai:<model>@<http(s) base url>"
    return None


def grader_problem(name: str) -> str | None:
    if name in GRADER_NAMES:
        return None
    return f"unknown grader {name!r} (known: {', '.join(GRADER_NAMES)})"


def serves(patterns: str, spec: str) -> bool:
    """Whether a worker group advertising `patterns` (comma-separated, shell-style) serves
    `spec`; e.g. "hf:smollm2-135m-instruct,null,replay:*"."""
    return any(fnmatchcase(spec, p.strip()) for p in patterns.split(",") if p.strip())
