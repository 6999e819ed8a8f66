"""Runs untrusted Python (model-written code + a task's tests) inside a bubblewrap sandbox.

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
* the host side: a wall-clock deadline that kills the whole process group (the pid
  namespace dies with it, --die-with-parent) and a cap on stdout+stderr volume.

The interpreter is the worker's own (`sys.executable`, resolved past a venv's link to it)
run with `-I -S`: no site-packages, no user site, as in the original HumanEval harness. The
environment is empty (bwrap --clearenv, and nothing passed to bwrap either).

A pass is the run's secret nonce arriving on a status pipe, written by the bootstrap only
after the program (and its tests) ran to its end; how the nonce is kept from the program is
told above _BOOTSTRAP. The same pipe tells whether the sandbox stood up at all: its first
byte comes from the bootstrap before any candidate code, so a program printing "bwrap: ..."
and failing is a wrong answer, never SandboxUnavailable. What the audit hook cannot promise:
a program exploiting a memory-safety bug of the interpreter itself could still find the
nonce (the host stays safe: every layer above holds regardless), and a program may still
rewrite attributes of shared modules (math.isclose) that the tests use.

`run_program` is synchronous and keeps no shared mutable state except lock-guarded caches
and the set of uids in use, so it is safe to call from many threads of a pool at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from evalstream.common.settings import SandboxSettings

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "check_sandbox",
    "run_program",
]

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
    passed: bool  # the whole program ran to its end, without an exception or exit
    timed_out: bool
    exit_code: int  # negative: killed by that signal
    stderr_tail: str
    stdout_tail: str
    duration_s: float
    output_exceeded: bool = False
    memory_exceeded: bool = False  # its cgroup's memory limit killed it (cgroup v2 only)


_STDERR_TAIL = 4096
_STDOUT_TAIL = 4096
_CHUNK = 65536
EXIT_EARLY_EXIT = 3  # the program called exit() before it finished
_STARTED = b"S"  # the bootstrap's first word on the status fd: the sandbox stood up
# Each run gets a host uid of its own from this range (when the worker is root): runs share
# no uid, so neither RLIMIT_NPROC's per-user count nor anything else joins them. Far above
# login users (1000+) and the usual subordinate-id ranges of /etc/subuid (100000+).
SANDBOX_UID_BASE = 1_900_000_000
_UID_SLOTS = 1024

# The program that runs first inside the sandbox (sandbox_bootstrap.py, passed with -c): it
# drops privileges, sets rlimits, arms the audit hook and runs the candidate's code, then the
# tests, in a thread of its own. How it keeps the pass marker out of reach is told there.
_BOOTSTRAP = (Path(__file__).parent / "sandbox_bootstrap.py").read_text(encoding="utf-8")


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


# --- running --------------------------------------------------------------------------------
_probed: set[tuple[str, str]] = set()
_probe_lock = threading.Lock()
_layouts: dict[str, _Layout] = {}
_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()


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


@contextlib.contextmanager
def _run_uid() -> Iterator[int]:
    """A host uid no other running sandbox has (0: the worker is not root, so the sandbox
    runs as the worker's own uid, mapped in a user namespace of its own)."""
    if os.geteuid() != 0:
        yield 0
        return
    with _uid_lock:
        # spread by pid too: several worker processes on one host pick different uids
        start = (os.getpid() * 7) % _UID_SLOTS
        slot = next((s for s in range(_UID_SLOTS) if (start + s) % _UID_SLOTS not in _uids_in_use), None)
        if slot is None:
            raise SandboxUnavailable(f"more than {_UID_SLOTS} sandboxes at once")
        uid_slot = (start + slot) % _UID_SLOTS
        _uids_in_use.add(uid_slot)
    try:
        yield SANDBOX_UID_BASE + uid_slot
    finally:
        with _uid_lock:
            _uids_in_use.discard(uid_slot)


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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # bwrap leads its own process group; killing it takes the pid namespace down with it
    # (--die-with-parent), grandchildren included.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


_Collected = tuple[bytes, bytes, bool, bool]  # stdout tail, stderr tail, timed out, output exceeded


def _collect(proc: subprocess.Popen[bytes], deadline: float, max_output: int) -> _Collected:
    """Reads stdout and stderr (keeping their tails) until the process ends, the deadline
    passes or the output grows past `max_output`."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    total = 0
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, (out, _STDOUT_TAIL))
        sel.register(proc.stderr, selectors.EVENT_READ, (err, _STDERR_TAIL))
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), True, False
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf, limit = key.data
                buf += chunk
                del buf[: max(0, len(buf) - limit)]
                total += len(chunk)
                if total > max_output:
                    return bytes(out), bytes(err), False, True
    try:  # both pipes closed: the process normally exits right after
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), True, False
    return bytes(out), bytes(err), False, False


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


def _execute(
    source: str,
    limits: Limits,
    bwrap: str,
    python: str,
    *,
    tests: str | None = None,
    entry_point: str | None = None,
    helpers: str | None = None,
) -> SandboxResult:
    layout = _layout(python)
    parent = cgroup_parent()
    nonce = secrets.token_hex(16)
    payload = json.dumps(
        {"nonce": nonce, "program": source, "tests": tests, "entry_point": entry_point, "helpers": helpers}
    )
    payload_fd = _memfd("evalstream-program", payload.encode("utf-8", "replace"))  # lone surrogates
    seccomp_fd = _memfd("evalstream-seccomp", _seccomp_filter(platform.machine()))
    status_read, status_write = os.pipe()
    start = time.monotonic()
    try:
        with _run_uid() as uid, _run_cgroup(parent, limits, f"run-{uid}-{nonce[:12]}") as cgroup:
            cmd = [
                bwrap,
                *_bwrap_args(layout, limits, uid),
                "--seccomp", str(seccomp_fd),
                python, "-I", "-S", "-c", _BOOTSTRAP,
                str(payload_fd), str(status_write), str(limits.memory_bytes), str(limits.max_file_bytes),
                str(limits.cpu_seconds), str(limits.max_open_files), str(limits.max_threads), str(uid),
                str(EXIT_EARLY_EXIT), layout.dynload,
            ]  # fmt: skip
            if cgroup is not None:
                cmd = [python, "-I", "-S", "-c", _ENTER_CGROUP, cgroup, *cmd]
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(payload_fd, seccomp_fd, status_write),
                    env={},  # the sandbox inherits nothing (bwrap and python are absolute paths)
                    start_new_session=True,
                )
            finally:
                os.close(payload_fd)
                os.close(seccomp_fd)
                os.close(status_write)
            out, err, timed_out, exceeded, exit_code = _wait(proc, start + limits.timeout_s, limits)
            oom = _oom_killed(cgroup)
        status = _read_status(status_read)
    finally:
        os.close(status_read)
    stderr = err.decode("utf-8", "replace")
    if not status.startswith(_STARTED) and not timed_out:
        # The bootstrap never ran: bwrap itself failed (namespaces refused, a bad mount...).
        # Decided by the status fd, which only the bootstrap writes to first: never by what
        # the candidate's code printed.
        first = (stderr.strip().splitlines() or [f"exit code {exit_code}"])[0][:300]
        raise SandboxUnavailable(f"the sandbox did not start: {first}; fix: {FIX_HINT}")
    finished = not (timed_out or exceeded) and exit_code == 0 and nonce.encode() in status
    return SandboxResult(
        passed=finished,
        timed_out=timed_out,
        exit_code=exit_code,
        stderr_tail=stderr,
        stdout_tail=out.decode("utf-8", "replace"),
        duration_s=time.monotonic() - start,
        output_exceeded=exceeded,
        memory_exceeded=oom,
    )


def _wait(
    proc: subprocess.Popen[bytes], deadline: float, limits: Limits
) -> tuple[bytes, bytes, bool, bool, int]:
    """Collects the run's output until it ends (killed at the deadline or past the output
    cap): stdout tail, stderr tail, timed out, output exceeded, exit code (-N: signal N)."""
    with proc:
        try:
            out, err, timed_out, exceeded = _collect(proc, deadline, limits.max_output_bytes)
        except BaseException:  # never leave a sandbox running behind an error
            _kill_group(proc)
            raise
        if timed_out or exceeded:
            _kill_group(proc)
        exit_code = proc.wait()
    if exit_code > 128:  # bwrap reports a child killed by signal N as 128 + N
        exit_code = 128 - exit_code
    return out, err, timed_out, exceeded, exit_code


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
        result = _execute("pass", Limits(timeout_s=30.0), bwrap_path, python_path)
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

    With `tests` and `entry_point` (HumanEval), the tests run after `source`, in a namespace
    of their own with builtins and modules restored, and `check(<entry_point>)` is called
    with the entry point held to plain return values. `helpers` (the task's prompt) runs
    first on its own: its definitions are those the tests see, whatever `source` redefines.
    A program passes when it runs to its end: an exception, exit() or a signal fails it.
    Raises SandboxUnavailable when the sandbox cannot be set up (never runs code without it).
    """
    if (tests is None) != (entry_point is None):
        raise ValueError("tests and entry_point go together")
    check_sandbox(python, bwrap)
    bwrap_path, python_path = _resolve(python, bwrap)
    return _execute(
        source, limits, bwrap_path, python_path, tests=tests, entry_point=entry_point, helpers=helpers
    )
