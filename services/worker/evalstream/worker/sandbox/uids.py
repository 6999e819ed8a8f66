"""Uids: one host uid per sandbox (when the worker is root), reused only once nothing of its
last run is left; a uid not confirmed empty within CONTAIN_TIMEOUT_S is quarantined (never
handed out again by this process, nor by any other worker process in its network namespace:
each uid in use is held as an abstract UNIX socket name).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from evalstream.worker.sandbox.policy import SandboxUnavailable

log = logging.getLogger("evalstream.worker.sandbox")  # one logger for the package, as before the split

# Each sandbox gets a host uid of its own from this range (when the worker is root): runs
# share no uid, so neither RLIMIT_NPROC's per-user count nor anything else joins them. Far
# above login users (1000+) and the usual subordinate-id ranges of /etc/subuid (100000+).
SANDBOX_UID_BASE = 1_900_000_000
_UID_SLOTS = 1024
# How long a run's processes may take to be gone once killed (a process with a large
# address space takes a while to unmap) before its uid is quarantined instead of reused.
CONTAIN_TIMEOUT_S = 10.0

_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()  # slots
_quarantined: set[int] = set()  # slots whose last run was not confirmed gone: never reused
_uid_claims: dict[int, socket.socket] = {}  # slot -> the abstract socket claiming its uid
_next_slot: list[int] = []  # where the round-robin search starts (set on first use)


@dataclass(slots=True)
class Lease:
    """A uid for one sandbox (0: the worker is not root; the sandbox then runs as the
    worker's uid mapped to nobody in a user namespace of its own)."""

    uid: int
    slot: int | None = None
    # whether every process that ran as `uid` is known gone: false from the launch until
    # the kill is confirmed (stop_sandbox); a lease released unconfirmed quarantines its uid
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
def run_uid() -> Iterator[Lease]:
    """A host uid no other sandbox has, with no process left of its previous run (0: the
    worker is not root). Slots are taken round-robin, so a uid is reused as late as possible.
    Released when the run ends if its processes were confirmed gone, else quarantined."""
    if os.geteuid() != 0:
        yield Lease(0)
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
    lease = Lease(SANDBOX_UID_BASE + slot, slot)
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


def wait_readable(fd: int, timeout: float) -> bool:
    """Whether `fd` turned readable within `timeout` (a pidfd: its process exited)."""
    return bool(select.select([fd], [], [], max(0.0, timeout))[0])


def uid_gone(uid: int, deadline: float) -> bool:
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
                if not wait_readable(pidfd, 0):  # alive: wait for its end
                    waited = wait_readable(pidfd, remaining) or True
            finally:
                os.close(pidfd)
        if not waited:  # a zombie not yet reaped: nothing to wait on but time
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, 0.1)
    return True
