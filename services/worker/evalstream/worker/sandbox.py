"""Runs untrusted Python (model-written code + a task's tests) inside a bubblewrap sandbox.

Isolation, layer by layer:

* bubblewrap: read-only view of the host root, private size-capped tmpfs /tmp (the only
  writable place), fresh read-only /dev, fresh /proc, new user/pid/net/ipc/uts namespaces
  (the network namespace holds only its own loopback: no host port, no outside address is
  reachable), all capabilities dropped, its own session (no TIOCSTI).
* a seccomp filter (classic BPF, built here, handed to bwrap) that refuses to create new
  processes: fork/vfork/clone without CLONE_THREAD fail with EPERM, so a fork bomb dies at
  its first fork. RLIMIT_NPROC cannot do this job: the kernel never enforces it for real
  uid 0, which the sandboxed program keeps whenever the worker runs as root.
* rlimits set by the bootstrap inside the sandbox before any candidate code runs: CPU time
  (SIGXCPU, then SIGKILL a second later: threads spinning in C code cannot outrun the wall
  clock's share of the machine), address space (1 GiB by default), file size, no core dumps.
* the host side: a wall-clock deadline that kills the whole process group (the sandbox's
  pid namespace dies with it, see --die-with-parent), and a cap on stdout+stderr volume.

The interpreter is the worker's own (`sys.executable`, resolved past a venv's link to it)
run with `-I -S`: no site-packages, no user site, so the candidate sees only the standard
library, as in the original HumanEval harness. The environment is empty (bwrap --clearenv,
and nothing passed to bwrap either): no credential of the worker's can leak into it.

A pass needs a secret nonce that the bootstrap prints only after the program ran to its end,
so that exiting early with status 0 or printing "PASS" is a fail. The nonce defends the
grade against accidents and naive tricks, not against a program that deliberately searches
its own interpreter's memory for it (it runs in the same process; so does, e.g., an object
whose __eq__ always answers True): grading integrity against adversarial code needs review
of the code, which no sandbox gives. The host's safety does not depend on the nonce.

`run_program` is synchronous and keeps no shared mutable state except a lock-guarded
"already probed" set, so it is safe to call from many threads of a pool at once.
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass

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


_STDERR_TAIL = 8192
_STDOUT_TAIL = 4096
_CHUNK = 65536
EXIT_EARLY_EXIT = 3  # the program called exit() before it finished

# Runs first inside the sandbox, as python -I -S -c BOOTSTRAP <program fd> <AS bytes>
# <FSIZE bytes> <CPU seconds> <exit code for an early exit()>. The program comes through an inherited memfd:
# not argv (size limits), not stdin (left to the program, at EOF). Its first line is a nonce,
# printed only after the program ran to its end, so an early os._exit(0) cannot pass for
# success. Tracebacks go through the `traceback` module, which reads source lines from
# linecache, so they show the failing line.
_BOOTSTRAP = """\
import linecache, os, resource, sys, traceback
fd, mem, fsize, cpu, early_exit = (int(a) for a in sys.argv[1:6])
with open(fd, "rb") as f:
    nonce, _, src = f.read().decode("utf-8").partition("\\n")
for res, soft, hard in (
    (resource.RLIMIT_AS, mem, mem),
    (resource.RLIMIT_FSIZE, fsize, fsize),
    (resource.RLIMIT_CORE, 0, 0),
    (resource.RLIMIT_CPU, cpu, cpu + 1),
):
    resource.setrlimit(res, (soft, hard))
linecache.cache["<candidate>"] = (len(src), None, src.splitlines(True), "<candidate>")
try:
    exec(compile(src, "<candidate>", "exec"), {"__name__": "__candidate__", "__builtins__": __builtins__})
except SystemExit as e:
    print(f"program called exit({e.code!r}) before it finished", file=sys.stderr)
    sys.stderr.flush()
    os._exit(early_exit)
except BaseException as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # skip this bootstrap's frame
    sys.stderr.flush()
    os._exit(1)
sys.stdout.flush()
sys.stderr.flush()
os.write(1, ("\\n" + nonce + "\\n").encode())
os._exit(0)
"""


# --- seccomp: no new processes ------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# syscall numbers: (clone, fork, vfork, clone3); aarch64 has neither fork nor vfork
_SYSCALLS = {"x86_64": (56, 57, 58, 435), "aarch64": (220, None, None, 435)}
_X32_BIT = 0x40000000
_CLONE_THREAD = 0x00010000
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
# BPF opcodes: ld|w|abs, jmp|jeq|k, jmp|jge|k, jmp|jset|k, ret|k
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _seccomp_filter(machine: str) -> bytes:
    """A classic-BPF program (struct sock_filter[]) for bwrap --seccomp.

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


def _execute(source: str, limits: Limits, bwrap: str, python: str) -> SandboxResult:
    nonce = secrets.token_hex(16)
    prog_fd = _memfd("evalstream-program", f"{nonce}\n{source}".encode("utf-8", "replace"))  # lone surrogates
    seccomp_fd = _memfd("evalstream-seccomp", _seccomp_filter(platform.machine()))
    cmd = [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--remount-ro", "/dev",  # its tmpfs (and /dev/shm in it) would be unbounded memory
        "--proc", "/proc",
        "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
        "--unshare-all",
        "--clearenv",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--chdir", "/tmp",
        "--seccomp", str(seccomp_fd),
        python, "-I", "-S", "-c", _BOOTSTRAP,
        str(prog_fd), str(limits.memory_bytes), str(limits.max_file_bytes), str(limits.cpu_seconds),
        str(EXIT_EARLY_EXIT),
    ]  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(prog_fd, seccomp_fd),
            env={},  # the sandbox inherits nothing (bwrap and python are absolute paths)
            start_new_session=True,
        )
    finally:
        os.close(prog_fd)
        os.close(seccomp_fd)
    with proc:
        try:
            out, err, timed_out, exceeded = _collect(proc, start + limits.timeout_s, limits.max_output_bytes)
        except BaseException:  # never leave a sandbox running behind an error
            _kill_group(proc)
            raise
        if timed_out or exceeded:
            _kill_group(proc)
        exit_code = proc.wait()
    if exit_code > 128:  # bwrap reports a child killed by signal N as 128 + N
        exit_code = 128 - exit_code
    duration = time.monotonic() - start
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    finished = not (timed_out or exceeded) and exit_code == 0 and stdout.rstrip().endswith(nonce)
    if not finished and exit_code != 0 and stderr.startswith("bwrap: "):
        # bwrap itself failed (namespaces refused, bad mount...): not the candidate's fault
        raise SandboxUnavailable(f"{stderr.strip().splitlines()[0]}; fix: {FIX_HINT}")
    if finished:
        stdout = stdout.rstrip()[: -len(nonce)].removesuffix("\n")
    return SandboxResult(
        passed=finished,
        timed_out=timed_out,
        exit_code=exit_code,
        stderr_tail=stderr,
        stdout_tail=stdout,
        duration_s=duration,
        output_exceeded=exceeded,
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
        result = _execute("pass", Limits(timeout_s=30.0), bwrap_path, python_path)
        if not result.passed:
            detail = result.stderr_tail.strip()[-500:] or f"exit code {result.exit_code}"
            raise SandboxUnavailable(f"sandbox self-test failed: {detail}; fix: {FIX_HINT}")
        _probed.add(key)


def run_program(
    source: str,
    limits: Limits = DEFAULT_LIMITS,
    *,
    python: str | None = None,
    bwrap: str | None = None,
) -> SandboxResult:
    """Runs `source` as a Python module in the sandbox and reports how it ended.

    A program passes when it runs to its end: an exception, exit() or a signal fails it.
    Raises SandboxUnavailable when the sandbox cannot be set up (never runs code without it).
    """
    check_sandbox(python, bwrap)
    bwrap_path, python_path = _resolve(python, bwrap)
    return _execute(source, limits, bwrap_path, python_path)
