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

How the two speak, and what a test sees, is told in bootstrap.py. A plain run
(`run_program(source)` without tests) is one sandbox whose pass is the program's own word
that it ran to its end (the nonce, kept from it by the audit hook alone): nothing else can
judge a plain program, and grading never relies on one. Whether bwrap itself failed is read
from the status pipes (their first byte comes from the bootstrap before any candidate code),
so a program printing "bwrap: ..." and failing is a wrong answer, never SandboxUnavailable.
What the layers do not promise: safety against a memory-safety bug of the interpreter or
the kernel (the host layers above still hold).

`run_program` is synchronous and keeps no shared mutable state except lock-guarded caches
and the set of uids in use, so it is safe to call from many threads of a pool at once.

One module a job:

    policy.py     limits, the result, the seccomp filter, what the sandbox sees, bwrap's arguments
    cgroups.py    a cgroup of the run's own, when delegated
    uids.py       a uid of the run's own, quarantined unless its processes are confirmed gone
    process.py    one sandbox started, its output read, and stopped with everything in it
    runs.py       a plain run and a graded run, and what each reports (run_program)
    bootstrap.py  what runs first inside each sandbox (read as text, never imported)
"""

from __future__ import annotations

from evalstream.worker.sandbox.policy import DEFAULT_LIMITS, Limits, SandboxResult, SandboxUnavailable
from evalstream.worker.sandbox.runs import check_sandbox, run_program
from evalstream.worker.sandbox.uids import SANDBOX_UID_BASE

__all__ = [
    "DEFAULT_LIMITS",
    "SANDBOX_UID_BASE",
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "check_sandbox",
    "run_program",
]
