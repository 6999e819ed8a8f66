"""Versions of the graders, in the shared library so that the producer can record them in
run manifests without the worker's code. Bump a grader's version whenever a change to it
(or to the response cleaning they share) can change a grade: the manifest hash changes with it.
"""

from __future__ import annotations

AUTO = "auto"
AUTO_VERSION = "1"  # the "auto" selection rules (evalstream.worker.grading.resolve_grader)
CLEAN_VERSION = "1"  # response cleaning (evalstream.worker.grading.clean)
GRADER_VERSIONS: dict[str, str] = {
    "exact": "1",
    "numeric": "1",
    "multiple_choice": "1",
    "code_exec": "1",
}


def graders_for(name: str) -> list[str]:
    """The concrete graders a job's grader `name` may use. Raises ValueError if unknown."""
    if name == AUTO:
        return sorted(GRADER_VERSIONS)
    if name not in GRADER_VERSIONS:
        raise ValueError(f"unknown grader {name!r}; known: {', '.join(sorted([AUTO, *GRADER_VERSIONS]))}")
    return [name]


def grader_version(name: str) -> str:
    """What a run manifest records: the versions of the grader(s) that `name` may use and of
    the response cleaning they share, e.g. "numeric/1 clean/1"."""
    parts = [f"{AUTO}/{AUTO_VERSION}"] if name == AUTO else []
    parts += [f"{n}/{GRADER_VERSIONS[n]}" for n in graders_for(name)]
    return " ".join([*parts, f"clean/{CLEAN_VERSION}"])
