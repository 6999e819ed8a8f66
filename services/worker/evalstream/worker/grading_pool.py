"""Grading in child processes, every item under a deadline.

The string graders (exact, numeric, choice, contains, json, regex) run here and not in the
worker's own process: a regular expression that backtracks for a minute on a degenerate
answer holds the GIL all that time, and with it the worker's event loop: its health probe,
its heartbeats, its Kafka group membership. In a child process it holds nothing of the
worker's. When one item takes longer than the deadline its process is killed, the item
fails with a clear error, and a fresh process takes the rest.

Children are started with `python -m evalstream.worker.grading_pool` (not forked: the
worker has threads, sockets and maybe a CUDA context), with an environment holding nothing
but what Python needs to start (no credentials), under a memory limit, and they import only
the graders. They take items in chunks and answer in one message per chunk, or more often
when items are slow (every FLUSH_S), so that the pipe round trip is paid per chunk. A child
silent for longer than the deadline is therefore on one item for about that long: it is
killed, and its unanswered items are graded again one per chunk, so that the item that
overruns is found (it fails, after a second deadline) and the others are graded.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

import msgspec

from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade

log = logging.getLogger("evalstream.worker")

CHUNK = 32  # items sent to a child at once
FLUSH_S = 0.05  # a child holding replies this long sends them before the chunk ends
START_TIMEOUT_S = 60.0
MAX_FAILED_STARTS = 3  # a child imports the graders once: slow on a loaded machine, never this slow
# What a child's environment keeps of the worker's: enough to start Python and import us.
CHILD_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LANG", "LC_ALL", "TZ")
_READY = b"ready"


class GradeTask(msgspec.Struct, array_like=True):
    spec: str  # canonical grader SPEC
    response: str
    item: Item


class GradeReply(msgspec.Struct, array_like=True, omit_defaults=True):
    grade: Grade | None = None
    error: str | None = None  # "<ExceptionType>: message": the item failed


class GradingTimeout(Exception):
    """A grader step ran past the deadline (a pattern that backtracks without end...)."""


class GradingUnavailable(RuntimeError):
    """The grading processes cannot start: a fault of this worker, not of the items."""


_encode = msgspec.msgpack.Encoder().encode
_decode_tasks = msgspec.msgpack.Decoder(list[GradeTask]).decode
_decode_replies = msgspec.msgpack.Decoder(list[GradeReply]).decode


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    to_child: Connection
    from_child: Connection
    ready: bool = False
    started_at: float = field(default_factory=time.monotonic)  # of its start, then of its current item
    in_hand: deque[int] = field(default_factory=deque)  # indices of the tasks it holds, in order

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        self.to_child.close()
        self.from_child.close()


class GradingPool:
    """`grade(tasks)` returns one GradeReply per task, in order. Thread-safe (one call at a
    time); children start on the first call and are replaced when killed or dead."""

    def __init__(self, processes: int, timeout_s: float, memory_bytes: int = 0) -> None:
        if processes < 1 or timeout_s <= 0:
            raise ValueError("a grading pool needs at least one process and a positive deadline")
        self.processes = processes
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self.killed = 0  # children killed for overrunning (metrics, tests)
        self._failed_starts = 0  # in a row: a child that dies before it is ready

    def start(self) -> None:
        """Starts the children now (else the first call does), so that the first batch does
        not wait for them."""
        with self._lock:
            self._top_up()
            for child in self._children:
                if not child.ready:
                    self._await_ready(child)

    def close(self) -> None:
        with self._lock:
            for child in self._children:
                child.to_child.close()  # the child sees EOF and exits
            for child in self._children:
                try:
                    child.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    child.kill()
            self._children.clear()

    def grade(self, tasks: list[GradeTask]) -> list[GradeReply]:
        if not tasks:
            return []
        with self._lock:
            return self._grade(tasks)

    # ------------------------------------------------------------------ the parent's side

    def _grade(self, tasks: list[GradeTask]) -> list[GradeReply]:
        replies: list[GradeReply | None] = [None] * len(tasks)
        size = max(1, min(CHUNK, math.ceil(len(tasks) / self.processes)))
        queue: deque[list[int]] = deque(
            list(range(i, min(i + size, len(tasks)))) for i in range(0, len(tasks), size)
        )
        self._top_up()
        while queue or any(c.in_hand for c in self._children):
            for child in self._children:
                if child.ready and not child.in_hand and queue:
                    self._hand(child, queue.popleft(), tasks)
            ready = wait([c.from_child for c in self._children], timeout=self._next_deadline())
            now = time.monotonic()
            for child in list(self._children):
                if child.from_child in ready:
                    self._receive(child, replies, queue, tasks)
                elif child.ready and child.in_hand and now - child.started_at > self.timeout_s:
                    if len(child.in_hand) == 1:  # alone in its chunk: this item is the one
                        index = child.in_hand.popleft()
                        error = f"grader {tasks[index].spec} took over {self.timeout_s:g} s on this answer"
                        replies[index] = GradeReply(error=f"{GradingTimeout.__name__}: {error}")
                    self._replace(child, queue, reason="overran its deadline")
                    self.killed += 1
                elif not child.ready and now - child.started_at > START_TIMEOUT_S:
                    self._replace(child, queue, reason="did not start")
        return [r if r is not None else GradeReply(error="GradingError: no reply") for r in replies]

    def _next_deadline(self) -> float:
        now = time.monotonic()
        waits = [
            (c.started_at + (self.timeout_s if c.ready else START_TIMEOUT_S)) - now
            for c in self._children
            if c.in_hand or not c.ready
        ]
        return max(0.0, min(waits)) + 0.001 if waits else self.timeout_s

    def _hand(self, child: _Child, chunk: list[int], tasks: list[GradeTask]) -> None:
        child.in_hand.extend(chunk)
        child.started_at = time.monotonic()
        child.to_child.send_bytes(_encode([tasks[i] for i in chunk]))

    def _receive(
        self, child: _Child, replies: list[GradeReply | None], queue: deque[list[int]], tasks: list[GradeTask]
    ) -> None:
        try:
            data = child.from_child.recv_bytes()
        except (EOFError, OSError):
            if len(child.in_hand) == 1:  # it died on this item (out of memory...): the item fails
                index = child.in_hand.popleft()
                status = child.proc.wait()
                replies[index] = GradeReply(
                    error=f"GradingError: grader {tasks[index].spec} crashed on this answer (exit status {status})"
                )
            self._replace(child, queue, reason="died")
            return
        if not child.ready:
            child.ready = data == _READY
            self._failed_starts = 0
            return
        for reply in _decode_replies(data):
            replies[child.in_hand.popleft()] = reply
        child.started_at = time.monotonic()  # the next item's deadline starts now

    def _replace(self, child: _Child, queue: deque[list[int]], *, reason: str) -> None:
        log.warning("grading process %d %s; starting another", child.proc.pid, reason)
        child.kill()
        self._children.remove(child)
        # its unanswered items again, one per chunk: the one that overran is then found alone
        queue.extendleft([i] for i in reversed(child.in_hand))
        if not child.ready:
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                raise GradingUnavailable(f"grading processes {reason} {self._failed_starts} times in a row")
        self._top_up()

    def _top_up(self) -> None:
        while len(self._children) < self.processes:
            self._children.append(self._spawn())

    def _spawn(self) -> _Child:
        task_r, task_w = os.pipe()
        reply_r, reply_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k in CHILD_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # import what we import
        args = [sys.executable, "-m", "evalstream.worker.grading_pool", str(task_r), str(reply_w)]
        args.append(str(self.memory_bytes))
        try:
            proc = subprocess.Popen(
                args, pass_fds=(task_r, reply_w), env=env, stdin=subprocess.DEVNULL, close_fds=True
            )
        finally:
            os.close(task_r)
            os.close(reply_w)
        return _Child(proc, Connection(task_w, readable=False), Connection(reply_r, writable=False))

    def _await_ready(self, child: _Child) -> None:
        with contextlib.suppress(EOFError, OSError):
            if child.from_child.poll(START_TIMEOUT_S):
                child.ready = child.from_child.recv_bytes() == _READY
        if not child.ready:
            raise GradingUnavailable(f"grading process {child.proc.pid} did not start")


# ---------------------------------------------------------------------- the child's side


def serve(tasks_fd: int, replies_fd: int, memory_bytes: int) -> None:
    """Grades chunks until the parent closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the worker's to handle
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from evalstream.worker.grading import get_grader  # the graders, and nothing else of the worker

    tasks_in = Connection(tasks_fd, writable=False)
    replies_out = Connection(replies_fd, readable=False)
    replies_out.send_bytes(_READY)
    while True:
        try:
            chunk = _decode_tasks(tasks_in.recv_bytes())
        except EOFError:
            return
        held: list[GradeReply] = []
        flushed = time.monotonic()
        for task in chunk:
            try:
                held.append(GradeReply(grade=get_grader(task.spec, task.item)(task.response, task.item)))
            except Exception as exc:  # any grader error fails the item, never the process
                held.append(GradeReply(error=f"{type(exc).__name__}: {exc}"[:2000]))
            if time.monotonic() - flushed >= FLUSH_S:
                replies_out.send_bytes(_encode(held))
                held, flushed = [], time.monotonic()
        if held:
            replies_out.send_bytes(_encode(held))


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
