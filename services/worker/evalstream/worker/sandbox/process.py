"""One sandbox: bubblewrap started with the bootstrap (bootstrap.py) in a role, its own uid
(uids.py) and cgroup (cgroups.py); its output read under one cap; and, however the run ends,
killed with everything in it through its pid namespace's init, and confirmed gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalstream.worker.sandbox import uids  # CONTAIN_TIMEOUT_S read when used: tests shorten it
from evalstream.worker.sandbox.cgroups import ENTER_CGROUP, cgroup_parent, oom_killed, run_cgroup
from evalstream.worker.sandbox.policy import Layout, Limits, bwrap_args, seccomp_filter
from evalstream.worker.sandbox.uids import Lease, run_uid, uid_gone, wait_readable

CHUNK = 65536
EXIT_EARLY_EXIT = 3  # the program called exit() before it finished
STARTED = b"S"  # the bootstrap's first word on the status fd: the sandbox stood up
# The program that runs first inside each sandbox (bootstrap.py, passed with -c): it
# drops privileges, sets rlimits, arms the audit hook and plays its role (judge, candidate or
# plain program) in a thread of its own.
_BOOTSTRAP_PATH = Path(__file__).parent / "bootstrap.py"
BOOTSTRAP = _BOOTSTRAP_PATH.read_text(encoding="utf-8")
EXIT_GONE = 4  # the judge's exit code when the candidate's process ended (or stopped reading) first


@dataclass(slots=True)
class Sandbox:
    proc: subprocess.Popen[bytes]
    status: int  # read end of its status pipe
    lease: Lease
    cgroup: str | None
    init: int | None = None  # pidfd of its pid namespace's init (None: it never came up)
    exit_code: int | None = None  # as it ended by itself (None: killed, or not yet ended)
    stopped: bool = False
    cleanup_s: float = 0.0
    oom: bool = False


def memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only the child we hand it to inherits it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def namespace_init(proc: subprocess.Popen[bytes], info: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's pid-namespace init, whose pid bwrap writes on --info-fd right
    after creating it; None if bwrap failed before (nothing ran) or it is already gone (then
    so is everything in its namespace). The pid is trusted only while that process is still
    the child of our bwrap, which we have not reaped: no other process can hold that pid."""
    data = bytearray()
    while not data.rstrip().endswith(b"}"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not wait_readable(info, remaining):
            return None
        chunk = os.read(info, 4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > 65536:
            return None
    try:
        pid = int(json.loads(data)["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (ValueError, KeyError, TypeError, OSError):
        return None
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
        at = status.find(b"\nPPid:")
        if at >= 0 and int(status[at + 6 :].split(None, 1)[0]) == proc.pid:
            return pidfd
    except (OSError, ValueError):
        pass
    os.close(pidfd)
    return None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    # bwrap (the launcher) leads its own process group; the sandbox's init and program are in
    # a session of their own, killed through the init (stop_sandbox)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop_sandbox(box: Sandbox) -> None:
    """Kills the sandbox and everything in it, reaps bwrap, and confirms that no process of
    the run is left (the namespace's init gone, no task of its uid in /proc): only then may
    its uid serve another run. Idempotent."""
    if box.stopped:
        return
    box.stopped = True
    began = time.monotonic()
    deadline = began + uids.CONTAIN_TIMEOUT_S
    if box.init is not None:  # pid 1 of the namespace: its death takes every task in it
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(box.init, signal.SIGKILL)
    if box.proc.returncode is None:  # not yet reaped: its pid (and group) is still ours
        kill_group(box.proc)
    contained = True
    try:
        box.proc.wait(timeout=uids.CONTAIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        contained = False
    if box.init is not None:
        try:
            # readable once the init exited, which the kernel lets happen only after every
            # other task of its namespace was killed and released
            contained = wait_readable(box.init, deadline - time.monotonic()) and contained
        finally:
            os.close(box.init)
            box.init = None
    if contained and box.lease.uid:
        contained = uid_gone(box.lease.uid, deadline)
    box.oom = oom_killed(box.cgroup)
    box.lease.contained = contained
    box.cleanup_s = time.monotonic() - began


@contextlib.contextmanager
def start_sandbox(
    layout: Layout,
    limits: Limits,
    bwrap: str,
    python: str,
    role: str,
    payload: dict[str, Any],
    deadline: float,
    pass_fds: tuple[int, ...] = (),
) -> Iterator[Sandbox]:
    """One bubblewrap sandbox running the bootstrap in `role` (judge, candidate or program)
    with `payload` (what that role needs), started with its own uid and (when delegated)
    cgroup; stopped, and confirmed gone, when the block ends, however it ends."""
    parent = cgroup_parent()
    payload_data = json.dumps(payload).encode("utf-8", "replace")  # lone surrogates
    payload_fd = memfd("evalstream-program", payload_data)
    seccomp_fd = memfd("evalstream-seccomp", seccomp_filter(platform.machine()))
    status_read, status_write = os.pipe()
    info_read, info_write = os.pipe()
    try:
        with (
            run_uid() as lease,
            run_cgroup(parent, limits, f"run-{lease.uid}-{secrets.token_hex(6)}") as cgroup,
        ):
            uid = lease.uid
            cmd = [
                bwrap,
                *bwrap_args(layout, limits, uid),
                "--info-fd", str(info_write),
                "--seccomp", str(seccomp_fd),
                python, "-I", "-S", "-c", BOOTSTRAP,
                str(payload_fd), str(status_write), str(limits.memory_bytes), str(limits.max_file_bytes),
                str(limits.cpu_seconds), str(limits.max_open_files), str(limits.max_threads), str(uid),
                str(EXIT_EARLY_EXIT), str(EXIT_GONE), layout.dynload, role,
            ]  # fmt: skip
            if cgroup is not None:
                cmd = [python, "-I", "-S", "-c", ENTER_CGROUP, cgroup, *cmd]
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(payload_fd, seccomp_fd, status_write, info_write, *pass_fds),
                    env={},  # the sandbox inherits nothing (bwrap and python are absolute paths)
                    start_new_session=True,
                )
            finally:
                for fd in (payload_fd, seccomp_fd, status_write, info_write):
                    os.close(fd)
                payload_fd = seccomp_fd = status_write = info_write = -1
            lease.contained = False  # from here on a process may run as `uid`
            box = Sandbox(proc, status_read, lease, cgroup)
            try:
                box.init = namespace_init(proc, info_read, deadline)
                yield box
            finally:
                stop_sandbox(box)
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
    finally:
        for fd in (payload_fd, seccomp_fd, status_write, info_write, status_read, info_read):
            if fd >= 0:
                os.close(fd)


def exit_code_of(code: int) -> int:
    return 128 - code if code > 128 else code  # bwrap reports a child killed by signal N as 128 + N


def wait_ended(box: Sandbox, until: float) -> int | None:
    """Its exit code if bwrap ends by itself before `until` (recorded), else None."""
    try:
        box.exit_code = exit_code_of(box.proc.wait(timeout=max(0.0, until - time.monotonic())))
    except subprocess.TimeoutExpired:
        return None
    return box.exit_code


class Output:
    """The tails of every stream of a run's sandboxes, read together, with one cap on their
    total volume."""

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.total = 0
        self.tails: dict[int, bytearray] = {}
        self._limits: dict[int, int] = {}
        self._open: dict[int, Any] = {}

    def watch(self, stream: Any, limit: int) -> int:
        fd = int(stream.fileno())
        self.tails[fd] = bytearray()
        self._limits[fd] = limit
        self._open[fd] = stream
        return fd

    def tail(self, fd: int) -> bytes:
        return bytes(self.tails[fd])

    def read(self, until: set[int], deadline: float) -> tuple[bool, bool]:
        """Reads every watched stream until those in `until` have all ended, the deadline
        passes or the total grows past the cap: (timed out, output exceeded)."""
        with selectors.DefaultSelector() as sel:
            for fd, stream in self._open.items():
                sel.register(stream, selectors.EVENT_READ, fd)
            while any(fd in self._open for fd in until):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return True, False
                for key, _ in sel.select(remaining):
                    fd = key.data
                    try:
                        chunk = os.read(fd, CHUNK)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fileobj)
                        del self._open[fd]
                        continue
                    buf = self.tails[fd]
                    buf += chunk
                    del buf[: max(0, len(buf) - self._limits[fd])]
                    self.total += len(chunk)
                    if self.total > self.max_output:
                        return False, True
        return False, False


def read_status(fd: int) -> bytes:
    """What the bootstrap (and whatever the program wrote there) left on the status pipe."""
    os.set_blocking(fd, False)
    data = bytearray()
    for _ in range(32):  # a pipe holds 64 KiB at most by default: bounded either way
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)
