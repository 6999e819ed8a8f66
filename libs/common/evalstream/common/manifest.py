"""The run manifest: everything that determines a run's answers and grades, hashed, so that
a report can name exactly what produced it and `evalctl reproduce` can run it again.

What the hash covers (`hashed_part`) is what determines the results: the dataset's content
(order- and format-independent), the model SPEC and whether a fallback model may answer,
the generation parameters and seed, the prompt templates actually applied (the job's own,
or the workers' per-grader defaults), the system prompt, whether the question was sent raw
(`prompt.raw`, present only for such runs: no template, system prompt or chat template),
the grader and its version, and the code version. It leaves out what identifies one submission or how it was executed:
run id and time (not in the manifest at all), the uploaded file (name, bytes hash, format:
a CSV and a JSONL of the same items are the same dataset), where the copy is stored (bucket
names differ between deployments), sharding, retries, worker pinning, cache use.

The model's weights hash is not knowable here (the producer has no model files): workers
report the revision that served each answer, and the run summary lists them
(`served_revisions`).
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from evalstream.common.graders import effective_templates, grader_version, graders_for, templates_sha256
from evalstream.common.keys import canonical_json
from evalstream.common.messages import JobSpec
from evalstream.common.settings import ProducerSettings

MANIFEST_VERSION = 2
UNHASHED = ("source", "execution")  # top-level sections the hash leaves out


@cache
def code_version() -> dict[str, Any]:
    """Package version, git commit and dirty flag of the code that ran (env overrides for
    images built without .git)."""
    try:
        version = metadata.version("evalstream")
    except metadata.PackageNotFoundError:
        version = "unknown"
    commit = ProducerSettings.from_env().evalstream_git_commit or None
    dirty: bool | None = None
    if commit is None:
        root = Path(__file__).resolve().parents[4]
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
            dirty = bool(
                subprocess.run(
                    ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout.strip()
            )
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"package": version, "git_commit": commit, "git_dirty": dirty}


def prompt_section(job: JobSpec) -> dict[str, Any]:
    templates = effective_templates(job.prompt_template, graders_for(job.grader))
    system = job.system_prompt
    section: dict[str, Any] = {
        "templates": templates,  # grader -> template text (items with `messages` use none)
        "templates_sha256": templates_sha256(templates),
        "system_prompt": system,
        "system_prompt_sha256": hashlib.sha256(system.encode()).hexdigest() if system else None,
    }
    if job.raw_prompt:
        # only then (the hashes of other runs stay as they were): the question was the whole
        # prompt, with none of the templates above, no system prompt and no chat template
        section["raw"] = True
    return section


def build_manifest(
    job: JobSpec,
    *,
    dataset_uri: str,
    dataset_sha256: str,
    content_sha256: str,
    dataset_format: str,
    total: int,
    shard_count: int,
    filename: str | None = None,
) -> dict[str, Any]:
    """`dataset_uri`: the content-addressed copy in S3 (what a reproduction reads);
    `dataset_sha256`: of the uploaded bytes; `content_sha256`: of the items."""
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "dataset": {"content_sha256": content_sha256, "items": total},
        "model": {"spec": job.model, "sla_fallback": job.sla_fallback},
        "generation": msgspec.to_builtins(job.generation),
        "seed": job.generation.seed,
        "prompt": prompt_section(job),
        "grader": {"name": job.grader, "version": grader_version(job.grader)},
        "code": code_version(),
        "source": {
            "uri": dataset_uri,
            "uploaded": job.dataset,
            "filename": filename,
            "sha256": dataset_sha256,
            "format": dataset_format,
        },
        "execution": {
            "shard_size": job.shard_size,
            "shard_count": shard_count,
            "retry": msgspec.to_builtins(job.retry),
            "worker_group": job.worker_group,
            "bypass_cache": job.bypass_cache,
            # the job's own template (None: the defaults), as a reproduction must pass it
            "prompt_template": job.prompt_template,
        },
    }
    if job.task is not None:  # only then: the hashes of runs without a task stay as they were
        manifest["task"] = task_section(job)
    return manifest


def task_section(job: JobSpec) -> dict[str, Any]:
    """The lm-evaluation-harness task the items were rendered from (`evalctl submit --task`):
    its files' text and their hash, the reader's version, the few-shot settings. Hashed: the
    same items rendered from another YAML are another run."""
    assert job.task is not None
    section: dict[str, Any] = msgspec.to_builtins(job.task)
    return section


def hashed_part(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k not in UNHASHED}


def manifest_sha256(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(hashed_part(manifest)).encode()).hexdigest()


def manifest_differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths where the hashed parts of two manifests differ, e.g. "code.git_commit"."""
    out: list[str] = []
    ha, hb = (hashed_part(a), hashed_part(b)) if not prefix else (a, b)
    for key in sorted(set(ha) | set(hb)):
        va, vb = ha.get(key), hb.get(key)
        path = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += manifest_differences(va, vb, f"{path}.")
        elif va != vb:
            out.append(path)
    return out


@dataclass(frozen=True)
class Request:
    """What a manifest asked for, whatever its manifest_version."""

    dataset_uri: str
    content_sha256: str
    model: str
    grader: str
    generation: dict[str, Any]
    prompt_template: str | None
    system_prompt: str | None
    shard_size: int
    retry: dict[str, Any]
    code: dict[str, Any]
    sla_fallback: bool = False
    grader_version: str | None = None  # not recorded before manifest_version 2
    templates: dict[str, str] | None = None  # idem
    task: dict[str, Any] | None = None  # the lm-eval task section (`evalctl submit --task`), if any
    raw_prompt: bool = False  # the question as the whole prompt (JobSpec.raw_prompt)


def request_from_manifest(m: dict[str, Any]) -> Request:
    if m.get("manifest_version", 1) == 1:
        return Request(
            dataset_uri=m["dataset"]["uri"],
            content_sha256=m["dataset"]["content_sha256"],
            model=m["model"],
            grader=m["grader"],
            generation=m["generation"],
            prompt_template=m.get("prompt_template"),
            system_prompt=m.get("system_prompt"),
            shard_size=m["shard_size"],
            retry=m["retry"],
            code=m["code"],
        )
    return Request(
        dataset_uri=m["source"]["uri"],
        content_sha256=m["dataset"]["content_sha256"],
        model=m["model"]["spec"],
        grader=m["grader"]["name"],
        generation=m["generation"],
        prompt_template=m["execution"]["prompt_template"],
        system_prompt=m["prompt"]["system_prompt"],
        shard_size=m["execution"]["shard_size"],
        retry=m["execution"]["retry"],
        code=m["code"],
        sla_fallback=m["model"]["sla_fallback"],
        grader_version=m["grader"]["version"],
        templates=m["prompt"]["templates"],
        task=m.get("task"),
        raw_prompt=bool(m["prompt"].get("raw", False)),
    )
