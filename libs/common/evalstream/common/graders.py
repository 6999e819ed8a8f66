"""The grader registry's metadata, in one table: name, version, argument, default prompt
template, aliases, and whether "auto" may pick it.

It lives in the shared library because the producer checks grader SPECs at intake and
records versions and templates in every run manifest without the worker's code; the worker
(evalstream.worker.grading) adds only the implementations, one module each, keyed by the same
names. Bump a grader's version whenever a change to it (or to the response cleaning they
share, CLEAN_VERSION) can change a grade: the manifest hash changes with it.

A grader SPEC is a name, or `name:argument` for the graders that take one:

    regex:<pattern>     the pattern to find in the response (else meta.regex, else the gold answer)
    json:<field.path>   the field of the response's JSON to compare (else meta.json_field)
    judge:<model SPEC>  the model that grades with a rubric (meta.rubric, else a default one)

`loglikelihood` and `perplexity` score instead of generating (lm-eval's multiple_choice /
loglikelihood and loglikelihood_rolling output types; evalstream.common.scoring): the engine
scores the item's raw question, to which no template is applied. `lm_eval` grades a generated
answer of an lm-eval generate_until task as lm-eval does: the task's filter pipelines (regex,
take_first) and its exact_match options, from the item's `meta.lm_eval`
(evalstream.common.lmeval_filters); the first pipeline's result is the grade. "auto" never
picks these three.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from evalstream.common.keys import canonical_json
from evalstream.common.specs import spec_problem

Argument = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class GraderInfo:
    version: str
    argument: Argument = "none"
    argument_hint: str = ""  # what the argument is, for error messages: "judge:<model SPEC>"
    template: str | None = None  # the default prompt template (None: FALLBACK_TEMPLATE)
    aliases: tuple[str, ...] = ()  # earlier names, still accepted
    auto: bool = False  # whether "auto" may pick it (by the item's shape)


GRADERS: dict[str, GraderInfo] = {  # by canonical name
    "exact": GraderInfo("1", template="{question}\n\nAnswer in a few words.", auto=True),
    # 2: exactly boxed > "####" > last number (no "answer is"); full-width forms
    "numeric": GraderInfo(
        "2",
        template="{question}\n\nWork it out, then give the final answer as a number on the last line.",
        auto=True,
    ),
    "choice": GraderInfo(
        "1",
        template="{question}\n\n{choices}\n\nAnswer with the letter of the correct choice.",
        aliases=("multiple_choice",),
        auto=True,
    ),
    "regex": GraderInfo("1", argument="optional", argument_hint="pattern"),
    "contains": GraderInfo("1"),
    "json": GraderInfo("1", argument="optional", argument_hint="field.path"),
    # 2: tests apart from the candidate (own builtins, plain return values only)
    # 3: a pass the candidate cannot forge (a per-run nonce out of its reach), nothing of the
    #    run outliving it: a cheating answer that passed under 2 fails
    "code": GraderInfo(
        "3",
        template="Complete the following Python function. Reply with the whole function in one "
        "```python code block.\n\n```python\n{question}```",
        aliases=("code_exec",),
        auto=True,
    ),
    "judge": GraderInfo("1", argument="required", argument_hint="model SPEC"),
    # log-likelihood scoring (evalstream.common.scoring): the raw question, no template
    "loglikelihood": GraderInfo("1"),
    "perplexity": GraderInfo("1"),
    # lm-eval's filters and exact_match on a generate_until task's answer (meta.lm_eval)
    "lm_eval": GraderInfo("1"),
}

AUTO = "auto"
AUTO_VERSION = "1"  # the "auto" selection rules (evalstream.worker.grading.resolve_grader)
CLEAN_VERSION = "1"  # response cleaning (evalstream.worker.grading.clean)
FALLBACK_TEMPLATE = "{question}"  # a grader without a default of its own

# Derived views, for readers that want one field of the table.
CANONICAL_GRADERS = tuple(GRADERS)
GRADER_ALIASES = {alias: name for name, info in GRADERS.items() for alias in info.aliases}
GRADER_NAMES = (AUTO, *CANONICAL_GRADERS, *GRADER_ALIASES)
AUTO_GRADERS = tuple(name for name, info in GRADERS.items() if info.auto)
GRADER_VERSIONS = {name: info.version for name, info in GRADERS.items()}
DEFAULT_TEMPLATES = {name: info.template for name, info in GRADERS.items() if info.template}


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
    info = GraderInfo(AUTO_VERSION) if name == AUTO else GRADERS.get(name)
    if info is None:
        return f"unknown grader {name!r} (known: {', '.join(GRADER_NAMES)})"
    if info.argument == "none":
        return None if argument is None else f"grader {name!r} takes no argument (got {argument!r})"
    if argument is None or not argument.strip():
        if info.argument == "required" or argument is not None:
            return f"grader {name!r} needs an argument: {name}:<{info.argument_hint}>"
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


def graders_for(name: str) -> list[str]:
    """The concrete graders a job's grader SPEC may use, by canonical name ("code_exec" ->
    ["code"], "regex:^a" -> ["regex"]). Raises ValueError if unknown."""
    if name == AUTO:
        return sorted(AUTO_GRADERS)
    canonical, _ = split_grader(name)
    if canonical not in GRADERS:
        raise ValueError(f"unknown grader {name!r}; known: {', '.join(GRADER_NAMES)}")
    return [canonical]


def grader_version(name: str) -> str:
    """What a run manifest records: the versions of the grader(s) that `name` may use and of
    the response cleaning they share, e.g. "numeric/1 clean/1"."""
    parts = [f"{AUTO}/{AUTO_VERSION}"] if name == AUTO else []
    parts += [f"{n}/{GRADERS[n].version}" for n in graders_for(name)]
    return " ".join([*parts, f"clean/{CLEAN_VERSION}"])


def template_for(grader: str, template: str | None) -> str:
    """The template a worker applies for an item graded by `grader` (never "auto"; a grader
    SPEC's argument, as in "regex:^a", does not matter)."""
    if template:
        return template
    info = GRADERS.get(split_grader(grader)[0])
    return info.template if info is not None and info.template else FALLBACK_TEMPLATE


def effective_templates(template: str | None, graders: Iterable[str]) -> dict[str, str]:
    """grader -> the template used for its items. A job's own template applies to all of
    them; expressed the same way either way, so that an explicit template equal to the
    default one describes the same run."""
    return {g: template_for(g, template) for g in sorted(graders)}


def templates_sha256(templates: dict[str, str]) -> str:
    return hashlib.sha256(canonical_json(templates).encode()).hexdigest()
