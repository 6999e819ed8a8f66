"""A run: a plain program in one sandbox, or a graded one in two (the candidate's program
answering calls, the judge running the tests against those answers), and what it reports
(SandboxResult): the verdict read from the status pipes, never from what the program printed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time

from evalstream.worker.sandbox.policy import (
    DEFAULT_LIMITS,
    FIX_HINT,
    Limits,
    SandboxResult,
    SandboxUnavailable,
    layout_of,
    resolve_paths,
)
from evalstream.worker.sandbox.process import (
    EXIT_GONE,
    STARTED,
    Output,
    exit_code_of,
    read_status,
    start_sandbox,
    stop_sandbox,
    wait_ended,
)

_STDERR_TAIL = 4096
_STDOUT_TAIL = 4096
# How long the candidate's sandbox may take to end by itself once the judge has ended (it
# sees its requests end and exits) before it is killed.
_CANDIDATE_GRACE_S = 0.5

_probed: set[tuple[str, str]] = set()  # (bwrap, python) that passed check_sandbox
_probe_lock = threading.Lock()


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
    layout = layout_of(python)
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    deadline = start + limits.timeout_s
    output = Output(limits.max_output_bytes)
    with start_sandbox(
        layout, limits, bwrap, python, "program", {"nonce": nonce, "program": source}, deadline
    ) as box:
        assert box.proc.stdout is not None and box.proc.stderr is not None
        out, err = output.watch(box.proc.stdout, _STDOUT_TAIL), output.watch(box.proc.stderr, _STDERR_TAIL)
        timed_out, exceeded = output.read({out, err}, deadline)
        code = None if timed_out or exceeded else wait_ended(box, deadline)
        timed_out = timed_out or (code is None and not exceeded)
        ended = time.monotonic()
        stop_sandbox(box)
        status = read_status(box.status)
    if not status.startswith(STARTED) and not (timed_out or exceeded):
        raise _unavailable(output.tail(err), code)
    return SandboxResult(
        passed=not (timed_out or exceeded) and code == 0 and nonce.encode() in status,
        timed_out=timed_out,
        exit_code=exit_code_of(box.proc.returncode) if code is None else code,
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
    layout = layout_of(python)
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    deadline = start + limits.timeout_s
    output = Output(limits.max_output_bytes)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pipes = [requests_read, requests_write, replies_read, replies_write]
    try:
        with contextlib.ExitStack() as stack:
            candidate = stack.enter_context(
                start_sandbox(
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
                start_sandbox(
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
            code = None if timed_out or exceeded else wait_ended(judge, deadline)
            timed_out = timed_out or (code is None and not exceeded)
            candidate_code = None
            if not (timed_out or exceeded):  # it sees its requests end: give it a moment
                candidate_code = wait_ended(candidate, min(deadline, time.monotonic() + _CANDIDATE_GRACE_S))
            ended = time.monotonic()
            stop_sandbox(candidate)
            stop_sandbox(judge)
            # what the candidate wrote before it went (its writers are all gone now: bounded)
            output.read({c_out, c_err}, time.monotonic() + 1.0)
            judge_status = read_status(judge.status)
            candidate_status = read_status(candidate.status)
    finally:
        for fd in pipes:
            os.close(fd)
    if not (timed_out or exceeded):
        if not judge_status.startswith(STARTED):
            raise _unavailable(output.tail(j_err), code)
        if code == EXIT_GONE and candidate_code is not None and not candidate_status.startswith(STARTED):
            raise _unavailable(output.tail(c_err), candidate_code)
    passed = not (timed_out or exceeded) and code == 0 and nonce.encode() in judge_status
    if code is None:
        exit_code = exit_code_of(judge.proc.returncode)
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
    bwrap_path, python_path = resolve_paths(python, bwrap)
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
    bwrap_path, python_path = resolve_paths(python, bwrap)
    if tests is None or entry_point is None:
        return _execute_plain(source, limits, bwrap_path, python_path)
    return _execute_judged(source, limits, bwrap_path, python_path, tests, entry_point, helpers)
