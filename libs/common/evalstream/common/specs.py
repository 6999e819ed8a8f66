"""What a job may name: model SPECs and graders. Checked by the producer (which must not
load a model to reject a typo) and honoured by workers."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from evalstream.common import providers

DEFAULT_MODEL = "hf:smollm2-135m-instruct"
BUNDLED_MODELS = ("smollm2-135m-instruct",)
SCHEMES = ("hf", "openai", "replay", "null")

# Grader names a job may ask for; "auto" picks one per item (code, choices, number, text).
# A grader SPEC is a name, or `name:argument` for the graders that take one:
#   regex:<pattern>     the pattern to find in the response (else meta.regex, else the gold answer)
#   json:<field.path>   the field of the response's JSON to compare (else meta.json_field)
#   judge:<model SPEC>  the model that grades with a rubric (meta.rubric, else a default one)
CANONICAL_GRADERS = ("exact", "numeric", "choice", "regex", "contains", "json", "code", "judge")
GRADER_ALIASES = {"multiple_choice": "choice", "code_exec": "code"}  # earlier names, still accepted
GRADER_NAMES = ("auto", *CANONICAL_GRADERS, *GRADER_ALIASES)
AUTO_GRADERS = ("code", "choice", "numeric", "exact")  # what "auto" picks from, by the item's shape
GRADERS_WITH_ARGUMENT = {"regex": False, "json": False, "judge": True}  # name -> argument required


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
        model, at, endpoint = rest.partition("@")
        if not model or not at:
            return f"model SPEC {spec!r}: expected openai:<model>@<http(s) base url or provider preset>"
        try:
            providers.expand_endpoint(endpoint)
        except ValueError as exc:
            return f"model SPEC {spec!r}: {exc}"
    return None


def split_grader(spec: str) -> tuple[str, str | None]:
    """(name, argument) of a grader SPEC, aliases resolved: `regex:^\\d+$` -> ("regex", "^\\d+$"),
    `choice` -> ("choice", None). Only the first colon splits, so that a judge's model SPEC
    keeps its own: `judge:openai:m@url` -> ("judge", "openai:m@url")."""
    name, sep, argument = spec.partition(":")
    name = GRADER_ALIASES.get(name.strip(), name.strip())
    return name, (argument if sep else None)


def json_path(path: str) -> list[str | int]:
    """The steps of a JSON field path: `answer.items.0` -> ["answer", "items", 0] (object keys,
    or list indices where numeric). Raises ValueError for an empty step."""
    parts = path.split(".")
    if not path or any(not p for p in parts):
        raise ValueError(f"bad JSON field path {path!r}: expected dot-separated names, e.g. answer.value")
    return [int(p) if p.isdigit() else p for p in parts]


def grader_problem(spec: str) -> str | None:
    """Why `spec` is not a grader SPEC (unknown name, missing or bad argument), or None."""
    name, argument = split_grader(spec)
    if name not in GRADER_NAMES:
        return f"unknown grader {name!r} (known: {', '.join(GRADER_NAMES)})"
    if name not in GRADERS_WITH_ARGUMENT:
        return None if argument is None else f"grader {name!r} takes no argument (got {argument!r})"
    if argument is None or not argument.strip():
        if GRADERS_WITH_ARGUMENT[name] or argument is not None:
            return f"grader {name!r} needs an argument: {name}:<{_ARGUMENT_HINT[name]}>"
        return None
    if name == "regex":
        try:
            re.compile(argument)
        except re.error as exc:
            return f"grader regex: bad pattern {argument!r}: {exc}"
    elif name == "json":
        try:
            json_path(argument)
        except ValueError as exc:
            return f"grader json: {exc}"
    elif name == "judge" and (problem := spec_problem(argument)):
        return f"grader judge: {problem}"
    return None


_ARGUMENT_HINT = {"regex": "pattern", "json": "field.path", "judge": "model SPEC"}


def serves(patterns: str, spec: str) -> bool:
    """Whether a worker group advertising `patterns` (comma-separated, shell-style) serves
    `spec`; e.g. "hf:smollm2-135m-instruct,null,replay:*"."""
    return any(fnmatchcase(spec, p.strip()) for p in patterns.split(",") if p.strip())
