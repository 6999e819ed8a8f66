"""Versions of the graders, in the shared library so that the producer can record them in
run manifests without the worker's code. Bump a grader's version whenever a change to it
(or to the response cleaning they share) can change a grade: the manifest hash changes with it.
"""

from __future__ import annotations

from evalstream.common.specs import AUTO_GRADERS, CANONICAL_GRADERS, GRADER_NAMES, split_grader

AUTO = "auto"
AUTO_VERSION = "1"  # the "auto" selection rules (evalstream.worker.grading.resolve_grader)
CLEAN_VERSION = "1"  # response cleaning (evalstream.worker.grading.clean)
GRADER_VERSIONS: dict[str, str] = {  # by canonical name (specs.CANONICAL_GRADERS)
    "exact": "1",
    "numeric": "2",  # 2: exactly boxed > "####" > last number (no "answer is"); full-width forms
    "choice": "1",
    "regex": "1",
    "contains": "1",
    "json": "1",
    "code": "2",  # 2: tests apart from the candidate (own builtins, plain return values only)
    "judge": "1",
}
assert set(GRADER_VERSIONS) == set(CANONICAL_GRADERS)


def graders_for(name: str) -> list[str]:
    """The concrete graders a job's grader SPEC may use, by canonical name ("code_exec" ->
    ["code"], "regex:^a" -> ["regex"]). Raises ValueError if unknown."""
    if name == AUTO:
        return sorted(AUTO_GRADERS)
    canonical, _ = split_grader(name)
    if canonical not in GRADER_VERSIONS:
        raise ValueError(f"unknown grader {name!r}; known: {', '.join(GRADER_NAMES)}")
    return [canonical]


def grader_version(name: str) -> str:
    """What a run manifest records: the versions of the grader(s) that `name` may use and of
    the response cleaning they share, e.g. "numeric/1 clean/1"."""
    parts = [f"{AUTO}/{AUTO_VERSION}"] if name == AUTO else []
    parts += [f"{n}/{GRADER_VERSIONS[n]}" for n in graders_for(name)]
    return " ".join([*parts, f"clean/{CLEAN_VERSION}"])
