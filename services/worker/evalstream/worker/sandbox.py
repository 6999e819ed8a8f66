"""Runs untrusted Python (model-written code + a task's tests) inside bubblewrap sandboxes.

Its safety does not depend on the worker's uid. Layer by layer:

* what it sees: only the interpreter, its shared library, its standard library
  (site-packages hidden) and the system's shared libraries, read-only; a private size-capped
  tmpfs /tmp (the only writable place); a read-only minimal /dev. No /proc, /etc, /run,
  /root, /home, checkout, stack data or host sockets. New pid/net/ipc/uts namespaces (the
  network namespace holds only its own loopback), its own session (no TIOCSTI).
* who it runs as: never root. When the worker is root, bwrap runs privileged without a user
  namespace and the bootstrap, before any candidate code, drops to a host uid of the run's
  own (SANDBOX_UID_BASE + slot: no two running sandboxes share one) with no groups and no
  capabilities (no_new_privs is set). Otherwise bwrap maps the worker's uid to nobody in a
  user namespace of its own (--disable-userns). Either way a root-only file is unreadable.
* a seccomp filter (classic BPF, built here) refusing new processes (fork/vfork/clone
  without CLONE_THREAD), new namespaces and mounts, and every way to memory outside
  RLIMIT_AS (memfd, SysV/POSIX shm and queues, io_uring...), see _REFUSED.
* memory: a cgroup v2 of the run's own (memory.max, swap 0, pids.max) when the operator
  delegated one (SANDBOX_CGROUP); always rlimits set before any candidate code runs: CPU
  time, address space, file size, open files (bounding pipe and socket buffers), threads
  (RLIMIT_NPROC, per run since the uid is the run's), no core dumps, no message queues; the
  tmpfs sizes. /dev (and /dev/shm) and bwrap's root are read-only.
* the host side: a wall-clock deadline and a cap on the output's volume.

Nothing of a run outlives it. bwrap puts the program in a session of its own, inside a pid
namespace whose init (bwrap's pid 1) the host knows by a pidfd (from bwrap's --info-fd,
checked to be the child of the bwrap we started). At the end of every run, whichever way it
ended, the host kills that init: the kernel then kills everything in the namespace and the
init's own exit completes only once every task in it is released, so the pidfd turning
readable means none is left. Only then, and once /proc shows no task of the run's uid, is
the uid free for another run; a uid not confirmed empty within CONTAIN_TIMEOUT_S is
quarantined (never handed out again by this process, nor by any other worker process in its
network namespace: each uid in use is held as an abstract UNIX socket name). Killing only
bwrap's process group was not enough: the program is in another session, its namespace died
asynchronously, and a program that filled its thread limit still had threads counting
against RLIMIT_NPROC when the uid's next run started its own.

The interpreter is the worker's own (`sys.executable`, resolved past a venv's link to it)
run with `-I -S`: no site-packages, no user site, as in the original HumanEval harness. The
environment is empty (bwrap --clearenv, and nothing passed to bwrap either).

A pass cannot be forged by the candidate's code, because the code that decides it never
shares a process with it. A graded run (tests and an entry point) uses two sandboxes, each a
bwrap of its own with its own uid, namespaces, rlimits and seccomp filter:

* the judge runs the task's helpers and tests, and calls `check(<entry point>)` with a
  stand-in that sends each call's arguments, as plain data, to the candidate's sandbox over
  a pipe and reads back the return value (or exception) as plain data. It never runs
  candidate code. A pass is the run's secret nonce on the judge's status pipe, written
  after `check` returned;
* the candidate's sandbox runs the program and answers calls. It never receives the nonce,
  the tests or their expected values. Walking every object its interpreter holds (frames
  reached from garbage the collector hands back, tracebacks, weakref callbacks, subclasses,
  modules), reading its own memory, or writing on every fd it has, finds and forges
  nothing: its only influence on the verdict is the values it returns, which is what the
  tests judge. It cannot reach the judge's memory (another pid namespace, another uid,
  ptrace and process_vm_readv refused, no /proc) and its replies are decoded as data of the
  plain types, never evaluated, so it cannot run code in the judge either.

How the two speak, and what a test sees, is told in sandbox_bootstrap.py. A plain run
(`run_program(source)` without tests) is one sandbox whose pass is the program's own word
that it ran to its end (the nonce, kept from it by the audit hook alone): nothing else can
judge a plain program, and grading never relies on one. Whether bwrap itself failed is read
from the status pipes (their first byte comes from the bootstrap before any candidate code),
so a program printing "bwrap: ..." and failing is a wrong answer, never SandboxUnavailable.
What the layers do not promise: safety against a memory-safety bug of the interpreter or
the kernel (the host layers above still hold).

`run_program` is synchronous and keeps no shared mutable state except lock-guarded caches
and the set of uids in use, so it is safe to call from many threads of a pool at once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import platform
import secrets
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from evalstream.common.settings import SandboxSettings

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "check_sandbox",
    "run_program",
]

log = logging.getLogger(__name__)

FIX_HINT = (
    "install bubblewrap (`apt-get install bubblewrap`) and make sure it can create namespaces "
    "(unprivileged user namespaces enabled, e.g. sysctl kernel.unprivileged_userns_clone=1 / "
    "kernel.apparmor_restrict_unprivileged_userns=0; in Docker run with "
    "--security-opt seccomp=unconfined --security-opt apparmor=unconfined or --privileged)"
)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here. Code is never executed unsandboxed instead."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = 10.0  # wall clock, sandbox start-up included
    cpu_seconds: int = 10  # RLIMIT_CPU of the candidate process (all its threads together)
    memory_bytes: int = 1 << 30  # RLIMIT_AS of the candidate process
    max_output_bytes: int = 1 << 20  # stdout + stderr; the run is killed beyond it
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE (files in the private /tmp)
    tmpfs_bytes: int = 64 << 20  # size of the private /tmp
    max_open_files: int = 64  # RLIMIT_NOFILE: also bounds what pipes and sockets can hold
    max_threads: int = 32  # RLIMIT_NPROC: threads of the run's own uid


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class SandboxResult:
    passed: bool  # the tests passed (graded run), or the program ran to its end (plain run)
    timed_out: bool
    exit_code: int  # negative: killed by that signal
    stderr_tail: str
    stdout_tail: str
    duration_s: float
    output_exceeded: bool = False
    memory_exceeded: bool = False  # its cgroup's memory limit killed it (cgroup v2 only)
    cleanup_s: float = 0.0  # from the run's end until every process of it was confirmed gone


_STDERR_TAIL = 4096
_STDOUT_TAIL = 4096
_CHUNK = 65536
EXIT_EARLY_EXIT = 3  # the program called exit() before it finished
_STARTED = b"S"  # the bootstrap's first word on the status fd: the sandbox stood up
# Each sandbox gets a host uid of its own from this range (when the worker is root): runs
# share no uid, so neither RLIMIT_NPROC's per-user count nor anything else joins them. Far
# above login users (1000+) and the usual subordinate-id ranges of /etc/subuid (100000+).
SANDBOX_UID_BASE = 1_900_000_000
_UID_SLOTS = 1024
# How long a run's processes may take to be gone once killed (a process with a large
# address space takes a while to unmap) before its uid is quarantined instead of reused.
CONTAIN_TIMEOUT_S = 10.0
# How long the candidate's sandbox may take to end by itself once the judge has ended (it
# sees its requests end and exits) before it is killed.
_CANDIDATE_GRACE_S = 0.5

# The program that runs first inside each sandbox (sandbox_bootstrap.py, passed with -c): it
# drops privileges, sets rlimits, arms the audit hook and plays its role (judge, candidate or
# plain program) in a thread of its own.
_BOOTSTRAP_PATH = Path(__file__).parent / "sandbox_bootstrap.py"
_BOOTSTRAP = _BOOTSTRAP_PATH.read_text(encoding="utf-8")
EXIT_GONE = 4  # the judge's exit code when the candidate's process ended (or stopped reading) first


# --- seccomp: no new processes, no memory outside the rlimits ------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# syscall numbers: (clone, fork, vfork, clone3); aarch64 has neither fork nor vfork
_SYSCALLS = {"x86_64": (56, 57, 58, 435), "aarch64": (220, None, None, 435)}
# Refused with EPERM: memory outside RLIMIT_AS (memfd_create, memfd_secret, SysV shm and
# message queues, POSIX message queues, io_uring, userfaultfd), new namespaces and mounts
# (unshare, setns, mount and the new mount API: a private tmpfs would be unbounded), and
# reaching other processes' memory (ptrace, process_vm_readv/writev), keyrings, bpf, perf.
_REFUSED = {
    "x86_64": (319, 447, 29, 68, 240, 425, 323, 272, 308, 165, 166, 155, 428, 429, 430, 431,
               432, 433, 442, 101, 310, 311, 248, 249, 250, 321, 298),
    "aarch64": (279, 447, 194, 186, 180, 425, 282, 97, 268, 40, 39, 41, 428, 429, 430, 431,
                432, 433, 442, 117, 270, 271, 217, 218, 219, 280, 241),
}  # fmt: skip
_X32_BIT = 0x40000000
_CLONE_THREAD = 0x00010000
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
# BPF opcodes: ld|w|abs, jmp|jeq|k, jmp|jge|k, jmp|jset|k, ret|k
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _seccomp_filter(machine: str) -> bytes:
    """A classic-BPF program (struct sock_filter[]) for bwrap --seccomp: no new processes,
    none of the calls in _REFUSED.

    clone3 answers ENOSYS (its flags live in memory a filter cannot read), so libc falls back
    to clone, whose flags it can read: threads (CLONE_THREAD) are allowed, new processes not.
    """
    if machine not in _SYSCALLS:
        raise SandboxUnavailable(f"no seccomp filter for architecture {machine!r}")
    clone, fork, vfork, clone3 = _SYSCALLS[machine]
    # (opcode, k, label if true, label if false); None = fall through to the next instruction
    body: list[tuple[int, int, str | None, str | None]] = [
        (_LD, 4, None, None),  # seccomp_data.arch
        (_JEQ, _AUDIT_ARCH[machine], None, "kill"),
        (_LD, 0, None, None),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        body.append((_JGE, _X32_BIT, "eperm", None))
    body.append((_JEQ, clone3, "enosys", None))
    body += [(_JEQ, nr, "eperm", None) for nr in (fork, vfork) if nr is not None]
    body += [(_JEQ, nr, "eperm", None) for nr in _REFUSED[machine]]
    body += [
        (_JEQ, clone, None, "allow"),
        (_LD, 16, None, None),  # low 32 bits of args[0] (the clone flags), little-endian
        (_JSET, _CLONE_THREAD, "allow", "eperm"),
    ]
    returns = {
        "allow": _RET_ALLOW,
        "eperm": _RET_ERRNO | _EPERM,
        "enosys": _RET_ERRNO | _ENOSYS,
        "kill": _RET_KILL_PROCESS,
    }
    at = {label: len(body) + i for i, label in enumerate(returns)}

    def offset(i: int, label: str | None) -> int:  # jumps are relative to the next instruction
        return 0 if label is None else at[label] - i - 1

    code = [(op, offset(i, jt), offset(i, jf), k) for i, (op, k, jt, jf) in enumerate(body)]
    code += [(_RET, 0, 0, value) for value in returns.values()]
    return b"".join(struct.pack("=HBBI", *ins) for ins in code)


# --- what the sandbox sees -------------------------------------------------------------------
_probed: set[tuple[str, str]] = set()
_probe_lock = threading.Lock()
_layouts: dict[str, _Layout] = {}


@dataclass(frozen=True, slots=True)
class _Layout:
    """What of the host the sandbox sees: the interpreter, its shared library, its standard
    library (site-packages hidden), the system's shared libraries. Nothing else: no /proc,
    no /etc, /run, /root, /home, checkout or stack data."""

    executable: str
    binds: tuple[str, ...]  # read-only, at the same path
    symlinks: tuple[tuple[str, str], ...]  # (target, link)
    hidden: tuple[str, ...]  # directories inside binds covered by an empty read-only tmpfs
    dynload: str  # the only place extension modules load from


_LAYOUT_PROBE = """\
import json, os, sys, sysconfig
v = sysconfig.get_config_var
paths = sysconfig.get_paths()
print(json.dumps({"stdlib": paths["stdlib"], "platstdlib": paths["platstdlib"],
    "site": sorted({paths["purelib"], paths["platlib"]}),
    "libpython": os.path.join(v("LIBDIR") or "", v("INSTSONAME") or ""),
    "multiarch": v("MULTIARCH") or "", "dynload": v("DESTSHARED") or ""}))
"""


def _layout(python: str) -> _Layout:
    """The paths `python` needs, asked of it once (outside the sandbox, with -I -S)."""
    if python in _layouts:
        return _layouts[python]
    try:
        out = subprocess.run(
            [python, "-I", "-S", "-c", _LAYOUT_PROBE], capture_output=True, env={}, timeout=30, check=True
        ).stdout
        info = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxUnavailable(f"cannot ask {python} for its standard library: {exc}") from exc
    binds = [python, info["stdlib"], info["platstdlib"]]
    if os.path.isfile(info["libpython"]):
        binds.append(info["libpython"])
    lib_dirs = (
        [f"/usr/lib/{info['multiarch']}", "/usr/lib64"] if info["multiarch"] else ["/usr/lib", "/usr/lib64"]
    )
    binds += [d for d in lib_dirs if os.path.isdir(d) and not os.path.islink(d)]
    symlinks = []
    for top in ("/lib", "/lib64", "/lib32"):  # merged /usr: links; else the loader lives here
        if os.path.islink(top):
            symlinks.append((os.readlink(top), top))
        elif os.path.isdir(top):
            binds.append(top)
    hidden = tuple(d for d in info["site"] if any(d.startswith(b + "/") for b in binds) and os.path.isdir(d))
    dynload = info["dynload"] or os.path.join(info["platstdlib"], "lib-dynload")
    layout = _Layout(python, tuple(dict.fromkeys(binds)), tuple(symlinks), hidden, dynload)
    _layouts[python] = layout
    return layout


# --- memory: a cgroup of the run's own, when delegated --------------------------------------------
CGROUP_ENV = "SANDBOX_CGROUP"
_CGROUP_SLACK = 32 << 20  # kernel memory, page tables, the interpreter's own pages
# Runs as root (the worker) before bwrap: joins the run's cgroup, then becomes bwrap, so that
# every process of the sandbox is born inside it.
_ENTER_CGROUP = """\
import os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write("0")
os.execv(sys.argv[2], sys.argv[2:])
"""


def cgroup_parent() -> str | None:
    """The delegated cgroup v2 folder runs get their own cgroup under (SANDBOX_CGROUP), or
    None: memory is then bounded by rlimits and tmpfs sizes alone (every allocation that
    escapes RLIMIT_AS is refused by seccomp or has nowhere to go: see _REFUSED).
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
def _run_cgroup(parent: str | None, limits: Limits, name: str) -> Iterator[str | None]:
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


def _oom_killed(cgroup: str | None) -> bool:
    if cgroup is None:
        return False
    try:
        with open(os.path.join(cgroup, "memory.events")) as f:
            events = dict(line.split() for line in f if line.strip())
    except (OSError, ValueError):
        return False
    return int(events.get("oom_kill", "0")) > 0


# --- uids: one per sandbox, reused only once nothing of its last run is left -------------------------
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()  # slots
_quarantined: set[int] = set()  # slots whose last run was not confirmed gone: never reused
_uid_claims: dict[int, socket.socket] = {}  # slot -> the abstract socket claiming its uid
_next_slot: list[int] = []  # where the round-robin search starts (set on first use)


@dataclass(slots=True)
class _Lease:
    """A uid for one sandbox (0: the worker is not root; the sandbox then runs as the
    worker's uid mapped to nobody in a user namespace of its own)."""

    uid: int
    slot: int | None = None
    # whether every process that ran as `uid` is known gone: false from the launch until
    # the kill is confirmed (_stop); a lease released unconfirmed quarantines its uid
    contained: bool = True


def _uid_busy(uid: int) -> bool:
    """Whether any task (thread, zombie included) has `uid` as its real uid, the one
    RLIMIT_NPROC counts by: getpriority(PRIO_USER) walks the kernel's task list and answers
    ESRCH when it finds none (microseconds, where reading every /proc/<pid>/status takes
    milliseconds)."""
    try:
        os.getpriority(os.PRIO_USER, uid)
    except ProcessLookupError:
        return False
    return True


def _pids_of(uid: int) -> list[int]:
    """The processes with `uid` among their uids, from /proc/<pid>/status (a process's /proc
    folder is root's once it changed uid, so its owner says nothing)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:  # gone meanwhile
            continue
        at = status.find(b"\nUid:")
        if at >= 0 and uid in {int(u) for u in status[at + 5 :].split(b"\n", 1)[0].split()}:
            found.append(int(name))
    return found


def _claim(uid: int) -> socket.socket | None:
    """Holds `uid` against every other worker process in this network namespace (an abstract
    socket name: atomic, gone with its process, never a stale file), or None if one holds it."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0evalstream-sandbox-uid-{uid}")
    except OSError as exc:
        claim.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise
    return claim


@contextlib.contextmanager
def _run_uid() -> Iterator[_Lease]:
    """A host uid no other sandbox has, with no process left of its previous run (0: the
    worker is not root). Slots are taken round-robin, so a uid is reused as late as possible.
    Released when the run ends if its processes were confirmed gone, else quarantined."""
    if os.geteuid() != 0:
        yield _Lease(0)
        return
    with _uid_lock:
        if not _next_slot:  # spread by pid too: worker processes on one host start apart
            _next_slot.append((os.getpid() * 7) % _UID_SLOTS)
        start = _next_slot[0]
        slot = claim = None
        for step in range(_UID_SLOTS):
            candidate = (start + step) % _UID_SLOTS
            if candidate in _uids_in_use or candidate in _quarantined:
                continue
            if _uid_busy(SANDBOX_UID_BASE + candidate):  # a crashed worker's leftovers
                continue
            claim = _claim(SANDBOX_UID_BASE + candidate)
            if claim is not None:
                slot = candidate
                break
        if slot is None or claim is None:
            raise SandboxUnavailable(
                f"no free sandbox uid: {len(_uids_in_use)} in use here, {len(_quarantined)} quarantined, "
                f"the rest held by other worker processes or with processes left (of {_UID_SLOTS})"
            )
        _uids_in_use.add(slot)
        _uid_claims[slot] = claim
        _next_slot[0] = (slot + 1) % _UID_SLOTS
    lease = _Lease(SANDBOX_UID_BASE + slot, slot)
    try:
        yield lease
    finally:
        with _uid_lock:
            _uids_in_use.discard(slot)
            if lease.contained:
                _uid_claims.pop(slot).close()
            else:  # kept claimed for good: no process of this namespace takes it either
                _quarantined.add(slot)
                log.warning(
                    "sandbox uid %d quarantined: its processes were not confirmed gone within %.0f s",
                    lease.uid,
                    CONTAIN_TIMEOUT_S,
                )


def _wait_readable(fd: int, timeout: float) -> bool:
    """Whether `fd` turned readable within `timeout` (a pidfd: its process exited)."""
    return bool(select.select([fd], [], [], max(0.0, timeout))[0])


def _uid_gone(uid: int, deadline: float) -> bool:
    """Waits until no task of `uid` is left, or the deadline: False if one still is. Right
    after the namespace's init is gone, none is; otherwise each process found is waited on
    through a pidfd (a zombie, whose reaper has yet to wait for it, only through time)."""
    backoff = 0.001
    while _uid_busy(uid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        waited = False
        pids = _pids_of(uid)
        if pids:
            try:
                pidfd = os.pidfd_open(pids[0])
            except ProcessLookupError:
                continue  # gone meanwhile: look again
            try:
                if not _wait_readable(pidfd, 0):  # alive: wait for its end
                    waited = _wait_readable(pidfd, remaining) or True
            finally:
                os.close(pidfd)
        if not waited:  # a zombie not yet reaped: nothing to wait on but time
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, 0.1)
    return True


# --- one sandbox: started, watched, and killed with everything in it ----------------------------------
@dataclass(slots=True)
class _Sandbox:
    proc: subprocess.Popen[bytes]
    status: int  # read end of its status pipe
    lease: _Lease
    cgroup: str | None
    init: int | None = None  # pidfd of its pid namespace's init (None: it never came up)
    exit_code: int | None = None  # as it ended by itself (None: killed, or not yet ended)
    stopped: bool = False
    cleanup_s: float = 0.0
    oom: bool = False


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only the child we hand it to inherits it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _resolve(python: str | None, bwrap: str | None) -> tuple[str, str]:
    bwrap_path = shutil.which(bwrap or "bwrap")
    if bwrap_path is None:
        raise SandboxUnavailable(f"bubblewrap ({bwrap or 'bwrap'}) is not installed; fix: {FIX_HINT}")
    # The real interpreter, not a venv's link to it: the sandbox needs no site-packages, and
    # a venv may live under /tmp, which the sandbox replaces with its own.
    python_path = os.path.realpath(python or sys.executable)
    if not os.access(python_path, os.X_OK):
        raise SandboxUnavailable(f"no Python interpreter to run in the sandbox ({python_path!r})")
    if python_path.startswith("/tmp/"):
        raise SandboxUnavailable(f"the interpreter {python_path} lies under /tmp, hidden in the sandbox")
    return bwrap_path, python_path


def _bwrap_args(layout: _Layout, limits: Limits, uid: int) -> list[str]:
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if uid:  # bwrap runs as root: no user namespace; the bootstrap drops to `uid` itself
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:  # bwrap runs unprivileged: the worker's uid is mapped to nobody in a namespace
        args += [
            "--unshare-user",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--disable-userns",
            "--cap-drop",
            "ALL",
        ]
    # the folders above the binds, traversable by the sandbox's uid (bwrap would copy the
    # host's modes: /root is 0700)
    parents = {str(p) for path in layout.binds for p in PurePosixPath(path).parents if str(p) != "/"}
    for parent in sorted(parents, key=lambda p: p.count("/")):
        args += ["--perms", "0755", "--dir", parent]
    for path in layout.binds:
        args += ["--ro-bind", path, path]
    for target, link in layout.symlinks:
        args += ["--symlink", target, link]
    for path in layout.hidden:
        args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    args += [
        "--dev", "/dev",
        "--remount-ro", "/dev",  # its tmpfs (and /dev/shm in it) would be unbounded memory
        "--perms", "1777", "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
        "--remount-ro", "/",  # bwrap's own root is an unbounded tmpfs too
        "--clearenv",
        "--die-with-parent",
        "--new-session",
        "--chdir", "/tmp",
    ]  # fmt: skip
    return args


def _namespace_init(proc: subprocess.Popen[bytes], info: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's pid-namespace init, whose pid bwrap writes on --info-fd right
    after creating it; None if bwrap failed before (nothing ran) or it is already gone (then
    so is everything in its namespace). The pid is trusted only while that process is still
    the child of our bwrap, which we have not reaped: no other process can hold that pid."""
    data = bytearray()
    while not data.rstrip().endswith(b"}"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not _wait_readable(info, remaining):
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # bwrap (the launcher) leads its own process group; the sandbox's init and program are in
    # a session of their own, killed through the init (_stop)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _stop(box: _Sandbox) -> None:
    """Kills the sandbox and everything in it, reaps bwrap, and confirms that no process of
    the run is left (the namespace's init gone, no task of its uid in /proc): only then may
    its uid serve another run. Idempotent."""
    if box.stopped:
        return
    box.stopped = True
    began = time.monotonic()
    deadline = began + CONTAIN_TIMEOUT_S
    if box.init is not None:  # pid 1 of the namespace: its death takes every task in it
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(box.init, signal.SIGKILL)
    if box.proc.returncode is None:  # not yet reaped: its pid (and group) is still ours
        _kill_group(box.proc)
    contained = True
    try:
        box.proc.wait(timeout=CONTAIN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        contained = False
    if box.init is not None:
        try:
            # readable once the init exited, which the kernel lets happen only after every
            # other task of its namespace was killed and released
            contained = _wait_readable(box.init, deadline - time.monotonic()) and contained
        finally:
            os.close(box.init)
            box.init = None
    if contained and box.lease.uid:
        contained = _uid_gone(box.lease.uid, deadline)
    box.oom = _oom_killed(box.cgroup)
    box.lease.contained = contained
    box.cleanup_s = time.monotonic() - began


@contextlib.contextmanager
def _sandbox(
    layout: _Layout,
    limits: Limits,
    bwrap: str,
    python: str,
    role: str,
    payload: dict[str, Any],
    deadline: float,
    pass_fds: tuple[int, ...] = (),
) -> Iterator[_Sandbox]:
    """One bubblewrap sandbox running the bootstrap in `role` (judge, candidate or program)
    with `payload` (what that role needs), started with its own uid and (when delegated)
    cgroup; stopped, and confirmed gone, when the block ends, however it ends."""
    parent = cgroup_parent()
    payload_data = json.dumps(payload).encode("utf-8", "replace")  # lone surrogates
    payload_fd = _memfd("evalstream-program", payload_data)
    seccomp_fd = _memfd("evalstream-seccomp", _seccomp_filter(platform.machine()))
    status_read, status_write = os.pipe()
    info_read, info_write = os.pipe()
    try:
        with (
            _run_uid() as lease,
            _run_cgroup(parent, limits, f"run-{lease.uid}-{secrets.token_hex(6)}") as cgroup,
        ):
            uid = lease.uid
            cmd = [
                bwrap,
                *_bwrap_args(layout, limits, uid),
                "--info-fd", str(info_write),
                "--seccomp", str(seccomp_fd),
                python, "-I", "-S", "-c", _BOOTSTRAP,
                str(payload_fd), str(status_write), str(limits.memory_bytes), str(limits.max_file_bytes),
                str(limits.cpu_seconds), str(limits.max_open_files), str(limits.max_threads), str(uid),
                str(EXIT_EARLY_EXIT), str(EXIT_GONE), layout.dynload, role,
            ]  # fmt: skip
            if cgroup is not None:
                cmd = [python, "-I", "-S", "-c", _ENTER_CGROUP, cgroup, *cmd]
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
            box = _Sandbox(proc, status_read, lease, cgroup)
            try:
                box.init = _namespace_init(proc, info_read, deadline)
                yield box
            finally:
                _stop(box)
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
    finally:
        for fd in (payload_fd, seccomp_fd, status_write, info_write, status_read, info_read):
            if fd >= 0:
                os.close(fd)


def _exit_code(code: int) -> int:
    return 128 - code if code > 128 else code  # bwrap reports a child killed by signal N as 128 + N


def _ended(box: _Sandbox, until: float) -> int | None:
    """Its exit code if bwrap ends by itself before `until` (recorded), else None."""
    try:
        box.exit_code = _exit_code(box.proc.wait(timeout=max(0.0, until - time.monotonic())))
    except subprocess.TimeoutExpired:
        return None
    return box.exit_code


class _Output:
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
                        chunk = os.read(fd, _CHUNK)
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


def _read_status(fd: int) -> bytes:
    """What the bootstrap (and whatever the program wrote there) left on the status pipe."""
    os.set_blocking(fd, False)
    data = bytearray()
    for _ in range(32):  # a pipe holds 64 KiB at most by default: bounded either way
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _unavailable(stderr: bytes, exit_code: int | None) -> SandboxUnavailable:
    # The bootstrap never ran: bwrap itself failed (namespaces refused, a bad mount...).
    # Decided by the status fd, which only the bootstrap writes to first: never by what
    # the candidate's code printed.
    text = stderr.decode("utf-8", "replace")
    first = (text.strip().splitlines() or [f"exit code {exit_code}"])[0][:300]
    return SandboxUnavailable(f"the sandbox did not start: {first}; fix: {FIX_HINT}")


def _tail(text: bytes, limit: int) -> str:
    return text[-limit:].decode("utf-8", "replace")


def _execute_plain(source: str, limits: Limits, bwrap: str, python: str) -> SandboxResult:
    """One sandbox: the program, and the nonce once it ran to its end (its own word)."""
    layout = _layout(python)
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    deadline = start + limits.timeout_s
    output = _Output(limits.max_output_bytes)
    with _sandbox(
        layout, limits, bwrap, python, "program", {"nonce": nonce, "program": source}, deadline
    ) as box:
        assert box.proc.stdout is not None and box.proc.stderr is not None
        out, err = output.watch(box.proc.stdout, _STDOUT_TAIL), output.watch(box.proc.stderr, _STDERR_TAIL)
        timed_out, exceeded = output.read({out, err}, deadline)
        code = None if timed_out or exceeded else _ended(box, deadline)
        timed_out = timed_out or (code is None and not exceeded)
        ended = time.monotonic()
        _stop(box)
        status = _read_status(box.status)
    if not status.startswith(_STARTED) and not (timed_out or exceeded):
        raise _unavailable(output.tail(err), code)
    return SandboxResult(
        passed=not (timed_out or exceeded) and code == 0 and nonce.encode() in status,
        timed_out=timed_out,
        exit_code=_exit_code(box.proc.returncode) if code is None else code,
        stderr_tail=_tail(output.tail(err), _STDERR_TAIL),
        stdout_tail=_tail(output.tail(out), _STDOUT_TAIL),
        duration_s=ended - start,
        output_exceeded=exceeded,
        memory_exceeded=box.oom,
        cleanup_s=box.cleanup_s,
    )


def _execute_judged(
    source: str, limits: Limits, bwrap: str, python: str, tests: str, entry_point: str, helpers: str | None
) -> SandboxResult:
    """Two sandboxes: the candidate's program answering calls, the judge running the tests
    against those answers. The verdict is the judge's alone (see the module docstring)."""
    layout = _layout(python)
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    deadline = start + limits.timeout_s
    output = _Output(limits.max_output_bytes)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pipes = [requests_read, requests_write, replies_read, replies_write]
    try:
        with contextlib.ExitStack() as stack:
            candidate = stack.enter_context(
                _sandbox(
                    layout,
                    limits,
                    bwrap,
                    python,
                    "candidate",
                    {"program": source, "entry_point": entry_point,
                     "requests": requests_read, "replies": replies_write},
                    deadline,
                    (requests_read, replies_write),
                )
            )  # fmt: skip
            judge = stack.enter_context(
                _sandbox(
                    layout,
                    limits,
                    bwrap,
                    python,
                    "judge",
                    {"nonce": nonce, "tests": tests, "entry_point": entry_point,
                     "helpers": helpers, "program_lines": source.count("\n"),
                     "requests": requests_write, "replies": replies_read},
                    deadline,
                    (requests_write, replies_read),
                )
            )  # fmt: skip
            for fd in pipes:  # the sandboxes hold them now: each side sees the other's end
                os.close(fd)
            pipes.clear()
            streams = [candidate.proc.stdout, candidate.proc.stderr, judge.proc.stdout, judge.proc.stderr]
            assert all(s is not None for s in streams)
            c_out, c_err = output.watch(streams[0], _STDOUT_TAIL), output.watch(streams[1], _STDERR_TAIL)
            j_out, j_err = output.watch(streams[2], _STDOUT_TAIL), output.watch(streams[3], _STDERR_TAIL)
            timed_out, exceeded = output.read({j_out, j_err}, deadline)
            code = None if timed_out or exceeded else _ended(judge, deadline)
            timed_out = timed_out or (code is None and not exceeded)
            candidate_code = None
            if not (timed_out or exceeded):  # it sees its requests end: give it a moment
                candidate_code = _ended(candidate, min(deadline, time.monotonic() + _CANDIDATE_GRACE_S))
            ended = time.monotonic()
            _stop(candidate)
            _stop(judge)
            # what the candidate wrote before it went (its writers are all gone now: bounded)
            output.read({c_out, c_err}, time.monotonic() + 1.0)
            judge_status = _read_status(judge.status)
            candidate_status = _read_status(candidate.status)
    finally:
        for fd in pipes:
            os.close(fd)
    if not (timed_out or exceeded):
        if not judge_status.startswith(_STARTED):
            raise _unavailable(output.tail(j_err), code)
        if code == EXIT_GONE and candidate_code is not None and not candidate_status.startswith(_STARTED):
            raise _unavailable(output.tail(c_err), candidate_code)
    passed = not (timed_out or exceeded) and code == 0 and nonce.encode() in judge_status
    if code is None:
        exit_code = _exit_code(judge.proc.returncode)
    elif code == EXIT_GONE and candidate_code is not None:
        exit_code = candidate_code  # the candidate's process ended first: its code says how
    else:
        exit_code = code
    return SandboxResult(
        passed=passed,
        timed_out=timed_out,
        exit_code=exit_code,
        stderr_tail=_tail(output.tail(c_err) + output.tail(j_err), _STDERR_TAIL),
        stdout_tail=_tail(output.tail(c_out) + output.tail(j_out), _STDOUT_TAIL),
        duration_s=ended - start,
        output_exceeded=exceeded,
        memory_exceeded=candidate.oom or judge.oom,
        cleanup_s=candidate.cleanup_s + judge.cleanup_s,
    )


def check_sandbox(python: str | None = None, bwrap: str | None = None) -> None:
    """Raises SandboxUnavailable unless a trivial program runs in the sandbox. Cached once
    it succeeds, so a worker can call it at start-up and `run_program` before every run."""
    bwrap_path, python_path = _resolve(python, bwrap)
    key = (bwrap_path, python_path)
    if key in _probed:
        return
    with _probe_lock:
        if key in _probed:
            return
        result = _execute_plain("pass", Limits(timeout_s=30.0), bwrap_path, python_path)
        if not result.passed:  # the interpreter started but could not run: not the code's fault
            detail = result.stderr_tail.strip()[-500:] or f"exit code {result.exit_code}"
            raise SandboxUnavailable(f"sandbox self-test failed: {detail}; fix: {FIX_HINT}")
        _probed.add(key)


def run_program(
    source: str,
    limits: Limits = DEFAULT_LIMITS,
    *,
    tests: str | None = None,
    entry_point: str | None = None,
    helpers: str | None = None,
    python: str | None = None,
    bwrap: str | None = None,
) -> SandboxResult:
    """Runs `source` as a Python module in the sandbox and reports how it ended.

    With `tests` and `entry_point` (HumanEval), the run is graded: the tests run in a sandbox
    of their own (the judge) and `check(<entry_point>)` is called with a stand-in whose calls
    go, as plain data, to `source`'s entry point in the candidate's sandbox; the run passes
    when `check` returns. `helpers` (the task's prompt) runs first in the judge: its
    definitions are those the tests see, whatever `source` redefines; without it the tests
    see only the entry point and builtins. The limits apply to each sandbox, the deadline
    and the output cap to the run as a whole.
    Without tests, a program passes when it runs to its end: an exception, exit() or a
    signal fails it (its own word: see the module docstring).
    Raises SandboxUnavailable when the sandbox cannot be set up (never runs code without it).
    """
    if (tests is None) != (entry_point is None):
        raise ValueError("tests and entry_point go together")
    check_sandbox(python, bwrap)
    bwrap_path, python_path = _resolve(python, bwrap)
    if tests is None or entry_point is None:
        return _execute_plain(source, limits, bwrap_path, python_path)
    return _execute_judged(source, limits, bwrap_path, python_path, tests, entry_point, helpers)
