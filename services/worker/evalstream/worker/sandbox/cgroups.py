"""Memory: a cgroup v2 of the run's own (memory.max, swap 0, pids.max) when the operator
delegated one (SANDBOX_CGROUP); without one, memory is bounded by rlimits and tmpfs sizes.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from evalstream.common.settings import SandboxSettings
from evalstream.worker.sandbox.policy import Limits, SandboxUnavailable

CGROUP_ENV = "SANDBOX_CGROUP"
_CGROUP_SLACK = 32 << 20  # kernel memory, page tables, the interpreter's own pages
# Runs as root (the worker) before bwrap: joins the run's cgroup, then becomes bwrap, so that
# every process of the sandbox is born inside it.
ENTER_CGROUP = """\
import os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write("0")
os.execv(sys.argv[2], sys.argv[2:])
"""


def cgroup_parent() -> str | None:
    """The delegated cgroup v2 folder runs get their own cgroup under (SANDBOX_CGROUP), or
    None: memory is then bounded by rlimits and tmpfs sizes alone (every allocation that
    escapes RLIMIT_AS is refused by seccomp or has nowhere to go: see policy._REFUSED).
    Raises SandboxUnavailable when one is named but unusable: never a silent fallback."""
    named = SandboxSettings.from_env().sandbox_cgroup.strip()
    if not named:
        return None
    try:
        with open(os.path.join(named, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
    except OSError as exc:
        raise SandboxUnavailable(f"{CGROUP_ENV}={named!r} is not a cgroup v2 folder: {exc}") from exc
    missing = {"memory", "pids"} - set(enabled)
    if missing or not os.access(named, os.W_OK):
        raise SandboxUnavailable(
            f"{CGROUP_ENV}={named!r}: needs the memory and pids controllers enabled for its children "
            f"(cgroup.subtree_control has {' '.join(enabled) or 'none'}) and to be writable by the worker"
        )
    return named


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@contextlib.contextmanager
def run_cgroup(parent: str | None, limits: Limits, name: str) -> Iterator[str | None]:
    """A cgroup of the run's own under `parent`, limiting its memory (all of it: heap, tmpfs,
    pipes, kernel memory) and its tasks; removed when the run ends."""
    if parent is None:
        yield None
        return
    path = os.path.join(parent, name)
    os.mkdir(path)
    try:
        _write(
            os.path.join(path, "memory.max"), str(limits.memory_bytes + limits.tmpfs_bytes + _CGROUP_SLACK)
        )
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: no swap to limit
            _write(os.path.join(path, "memory.swap.max"), "0")
        _write(os.path.join(path, "pids.max"), str(limits.max_threads + 8))
        yield path
    finally:
        for _ in range(100):  # the pid namespace may take a moment to empty
            try:
                os.rmdir(path)
                break
            except OSError:
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "cgroup.kill"), "1")
                time.sleep(0.02)


def oom_killed(cgroup: str | None) -> bool:
    if cgroup is None:
        return False
    try:
        with open(os.path.join(cgroup, "memory.events")) as f:
            events = dict(line.split() for line in f if line.strip())
    except (OSError, ValueError):
        return False
    return int(events.get("oom_kill", "0")) > 0
