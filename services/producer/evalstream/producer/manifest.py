"""The run manifest: everything that determines a run's answers, hashed, so that a report
can name exactly what produced it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from evalstream.common.keys import canonical_json
from evalstream.common.messages import JobSpec


@cache
def code_version() -> dict[str, Any]:
    """Package version, git commit and dirty flag of the code that ran (env overrides for
    images built without .git)."""
    try:
        version = metadata.version("evalstream")
    except metadata.PackageNotFoundError:
        version = "unknown"
    commit = os.environ.get("EVALSTREAM_GIT_COMMIT") or None
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


def build_manifest(
    job: JobSpec,
    *,
    dataset_uri: str,
    dataset_sha256: str,
    content_sha256: str,
    dataset_format: str,
    total: int,
    shard_count: int,
) -> dict[str, Any]:
    return {
        "dataset": {
            "uri": dataset_uri,
            "sha256": dataset_sha256,
            "content_sha256": content_sha256,
            "format": dataset_format,
            "items": total,
        },
        "model": job.model,
        "grader": job.grader,
        "generation": msgspec.to_builtins(job.generation),
        "prompt_template": job.prompt_template,
        "system_prompt": job.system_prompt,
        "shard_size": job.shard_size,
        "shard_count": shard_count,
        "retry": msgspec.to_builtins(job.retry),
        "seed": job.generation.seed,
        "code": code_version(),
    }


def manifest_sha256(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(manifest).encode()).hexdigest()
