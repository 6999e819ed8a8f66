"""What a sandbox may do and see: its limits (Limits) and what a run reports (SandboxResult),
the seccomp filter, the host paths bound into it (Layout) and bubblewrap's arguments. The
layers and why they hold are told in the package's docstring (__init__.py).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import PurePosixPath

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


def seccomp_filter(machine: str) -> bytes:
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
@dataclass(frozen=True, slots=True)
class Layout:
    """What of the host the sandbox sees: the interpreter, its shared library, its standard
    library (site-packages hidden), the system's shared libraries. Nothing else: no /proc,
    no /etc, /run, /root, /home, checkout or stack data."""

    executable: str
    binds: tuple[str, ...]  # read-only, at the same path
    symlinks: tuple[tuple[str, str], ...]  # (target, link)
    hidden: tuple[str, ...]  # directories inside binds covered by an empty read-only tmpfs
    dynload: str  # the only place extension modules load from


_layouts: dict[str, Layout] = {}

_LAYOUT_PROBE = """\
import json, os, sys, sysconfig
v = sysconfig.get_config_var
paths = sysconfig.get_paths()
print(json.dumps({"stdlib": paths["stdlib"], "platstdlib": paths["platstdlib"],
    "site": sorted({paths["purelib"], paths["platlib"]}),
    "libpython": os.path.join(v("LIBDIR") or "", v("INSTSONAME") or ""),
    "multiarch": v("MULTIARCH") or "", "dynload": v("DESTSHARED") or ""}))
"""


def layout_of(python: str) -> Layout:
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
    layout = Layout(python, tuple(dict.fromkeys(binds)), tuple(symlinks), hidden, dynload)
    _layouts[python] = layout
    return layout


def resolve_paths(python: str | None, bwrap: str | None) -> tuple[str, str]:
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


def bwrap_args(layout: Layout, limits: Limits, uid: int) -> list[str]:
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
