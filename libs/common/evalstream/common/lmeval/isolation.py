"""Reading a task in a child process with hard limits: what the sandbox's bounds cannot stop
(a `regex_replace` pattern that backtracks for ever, loops nested over long fields, a huge
literal) ends there, at the wall-clock timeout, the CPU-time limit or the address-space
limit, and the caller gets a TaskError saying which.

    read_tasks_isolated(path, root=..., data_dir=..., timeout=300)

The child is `python -m evalstream.common.lmeval.isolation`: the request on stdin (JSON), the
rendered tasks on stdout (msgspec JSON), a TaskError as {"error": ...}. It reads s3:// data
files of the datasets bucket with the S3 settings of its environment (the caller's).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from evalstream.common.lmeval import DEFAULT_FEWSHOT_SEED, RenderedTask, read_tasks
from evalstream.common.lmeval.errors import TaskDataError, TaskError, TaskRefused
from evalstream.common.lmeval.hub import HuggingFaceHub

DEFAULT_TIMEOUT_S = 600.0
MEMORY_BYTES = 8 * 1024**3  # address space of the child


class Request(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    root: str | None = None
    data_dir: str | None = None
    num_fewshot: int | None = None
    fewshot_seed: int = DEFAULT_FEWSHOT_SEED
    limit: int | None = None
    s3: bool = False
    hub: bool = False
    cpu_s: int = int(DEFAULT_TIMEOUT_S)
    memory_bytes: int = MEMORY_BYTES


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    kind: str  # "refused", "data", "task"


_KINDS: dict[str, type[TaskError]] = {"refused": TaskRefused, "data": TaskDataError, "task": TaskError}


# What the child may see of the parent's environment: what Python needs to start and find
# the project, never a credential (the task is untrusted; what it reads comes in the request).
_INHERITED = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "HOME", "TMPDIR")


def _inherited() -> dict[str, str]:
    return {k: os.environ[k] for k in _INHERITED if k in os.environ}


def _apply_limits(request: Request) -> None:
    """Set by the child on itself, first thing (not by a preexec_fn: the caller may run threads)."""
    resource.setrlimit(resource.RLIMIT_AS, (request.memory_bytes, request.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (request.cpu_s, request.cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def read_tasks_isolated(
    path: str | Path,
    *,
    root: str | Path | None = None,
    data_dir: str | Path | None = None,
    num_fewshot: int | None = None,
    fewshot_seed: int = DEFAULT_FEWSHOT_SEED,
    limit: int | None = None,
    s3: bool = False,
    hub: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[RenderedTask]:
    """read_tasks in a child process with time and memory limits."""
    request = Request(
        path=str(Path(path).expanduser().absolute()),
        root=str(Path(root).expanduser().absolute()) if root is not None else None,
        data_dir=str(Path(data_dir).expanduser().absolute()) if data_dir is not None else None,
        num_fewshot=num_fewshot,
        fewshot_seed=fewshot_seed,
        limit=limit,
        s3=s3,
        hub=hub,
        cpu_s=int(timeout) + 1,
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "evalstream.common.lmeval.isolation"],
            input=msgspec.json.encode(request),
            capture_output=True,
            timeout=timeout,
            env={**_inherited(), "PYTHONHASHSEED": "0"},
        )
    except subprocess.TimeoutExpired:
        raise TaskError(
            f"reading the task took over {timeout:.0f} s: stopped (a template or pattern that does not end?)"
        ) from None
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        why = "; ".join(tail) or f"exit status {proc.returncode}"
        if proc.returncode < 0 or "MemoryError" in why:
            why = f"stopped by its limits ({why})"
        raise TaskError(f"reading the task failed: {why}")
    out = proc.stdout
    if out.startswith(b'{"error"'):
        failure = msgspec.json.decode(out, type=Failure)
        raise _KINDS.get(failure.kind, TaskError)(failure.error)
    return msgspec.json.decode(out, type=list[RenderedTask])


def _fetch_s3() -> Any:
    from evalstream.common import storage
    from evalstream.common.settings import Settings

    settings = Settings.from_env()
    client = storage.client(settings)

    def fetch(uri: str) -> bytes:
        bucket, key = storage.parse_s3_uri(uri)
        if bucket != settings.s3_bucket_datasets:
            raise TaskRefused(f"{uri}: data is read from the bucket {settings.s3_bucket_datasets!r} only")
        return storage.get_bytes(client, bucket, key, max_bytes=2 * 1024**3)

    return fetch


def main() -> int:
    request = msgspec.json.decode(sys.stdin.buffer.read(), type=Request)
    _apply_limits(request)
    try:
        tasks = read_tasks(
            request.path,
            root=request.root,
            data_dir=request.data_dir,
            num_fewshot=request.num_fewshot,
            fewshot_seed=request.fewshot_seed,
            limit=request.limit,
            fetch=_fetch_s3() if request.s3 else None,
            hub=HuggingFaceHub() if request.hub else None,
        )
    except TaskError as exc:
        kind = (
            "refused"
            if isinstance(exc, TaskRefused)
            else "data"
            if isinstance(exc, TaskDataError)
            else "task"
        )
        sys.stdout.buffer.write(msgspec.json.encode(Failure(error=str(exc), kind=kind)))
        return 0
    sys.stdout.buffer.write(msgspec.json.encode(tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
