"""Nothing of a sandboxed run outlives it (issue 26): every process and thread of a run is
gone, confirmed, before its uid serves another run, and a uid that cannot be confirmed empty
is quarantined instead of reused.

The attack: completions that fill their thread limit (RLIMIT_NPROC counts a uid's threads)
and hang until the deadline. When only bwrap's process group was killed, their threads
(in a session of their own, in a pid namespace dying asynchronously) were still counted
against the uid when its next run started, whose bootstrap then failed to start its own
thread: a canonical answer graded wrong.

Real sandboxes throughout (bubblewrap, the worker's interpreter); the uid checks need root.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from evalstream.common.messages import Item
from evalstream.worker.grading.code_exec import code_exec
from evalstream.worker.sandbox import SANDBOX_UID_BASE, Limits, run_program
from evalstream.worker.sandbox import uids as uid_pool  # the uid pool, whose state these tests look into

PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
ITEM = Item(id="add", question=PROMPT, entry_point="add", test=TEST)
CANONICAL = "    return a + b\n"

# A completion that says which uid it runs as, makes its teardown slow (memory to unmap,
# threads at the lowest scheduling class), fills its thread limit and hangs.
HOG = (
    "    import os, threading, time\n"
    "    print('uid', os.getuid(), flush=True)\n"
    "    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "    blob = bytearray({mb} << 20)\n"
    "    for i in range(0, len(blob), 4096):\n        blob[i] = 1\n"
    "    threading.stack_size(1 << 16)\n"
    "    started = 0\n"
    "    try:\n        while True:\n"
    "            threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n"
    "            started += 1\n"
    "    except RuntimeError:\n        pass\n"
    "    print('threads', started, flush=True)\n"
    "    time.sleep(1000)\n"
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="sandbox uids are the run's own only when the worker is root"
)


def uid_busy(uid: int) -> bool:
    """Whether any task (thread, zombie) of `uid` exists: RLIMIT_NPROC's count is not 0."""
    try:
        os.getpriority(os.PRIO_USER, uid)
    except ProcessLookupError:
        return False
    return True


def printed(text: str, word: str) -> int:
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(word + " "))


@needs_root
def test_thread_filling_hangs_then_a_canonical_answer_passes() -> None:
    """The attack as reported: more hanging thread-fillers than run at once, eight at a
    time as a grading pool would, each timed out; then canonical answers on the same pool
    must pass, and no uid of a hog may have a task left once its grade is known."""
    grade = code_exec(Limits(timeout_s=3.0))
    hog = HOG.format(mb=64)

    def attack(_: int) -> tuple[bool, str, bool]:
        g = grade(hog, ITEM)
        uid = printed(g.evidence or "", "uid")
        return g.correct, g.detail or "", uid_busy(uid)

    with ThreadPoolExecutor(8) as pool:
        hogs = list(pool.map(attack, range(12)))
        assert all(not correct and detail.startswith("timed out") for correct, detail, _ in hogs), hogs
        assert not any(left for _, _, left in hogs), "a hog's uid still had tasks after its run"
        canonical = list(pool.map(lambda _: grade(CANONICAL, ITEM), range(12)))
    assert [g.detail for g in canonical if not g.correct] == []


@needs_root
@pytest.mark.parametrize("graded", [False, True], ids=["plain", "graded"])
def test_a_timed_out_run_leaves_no_task_of_its_uid(graded: bool) -> None:
    """Checked the moment run_program returns: a program with hundreds of MB to unmap and
    its thread limit filled took tens of milliseconds to die after bwrap did, its uid
    already handed back."""
    body = HOG.format(mb=600)
    if graded:
        result = run_program(
            PROMPT + body, Limits(timeout_s=4.0), tests=TEST, entry_point="add", helpers=PROMPT
        )
    else:
        result = run_program(textwrap.dedent(body), Limits(timeout_s=4.0))
    uid = printed(result.stdout_tail, "uid")
    left = uid_busy(uid)
    assert result.timed_out and not result.passed
    assert printed(result.stdout_tail, "threads") >= Limits().max_threads - 4  # it did fill them
    assert SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + uid_pool._UID_SLOTS
    assert not left, f"uid {uid} still has tasks after the run returned"
    assert 0 < result.cleanup_s < uid_pool.CONTAIN_TIMEOUT_S


@needs_root
def test_consecutive_runs_take_different_uids() -> None:
    """Round-robin: a uid is reused as late as possible, never by the very next run."""
    uids = [int(run_program("import os\nprint(os.getuid())").stdout_tail) for _ in range(4)]
    assert len(set(uids)) == 4, uids


@pytest.fixture
def stray() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started here as a sandbox uid (standing for a run's leftovers), killed after."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def run_as(uid: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
    deadline = time.monotonic() + 10
    while not uid_busy(uid):  # setpriv has dropped to the uid once the kernel counts it
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    return proc


@needs_root
def test_a_uid_with_a_process_left_is_not_handed_out(stray: list[subprocess.Popen[bytes]]) -> None:
    """A uid some process still runs as (a crashed worker's leftover) is skipped."""
    with uid_pool._uid_lock:
        if not uid_pool._next_slot:
            uid_pool._next_slot.append(0)
        upcoming = SANDBOX_UID_BASE + uid_pool._next_slot[0]
    stray.append(run_as(upcoming))
    uid = int(run_program("import os\nprint(os.getuid())").stdout_tail)
    assert uid != upcoming


@needs_root
def test_a_uid_not_confirmed_empty_is_quarantined(
    stray: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process of the run's uid that outlives the run (here: started from outside while it
    runs) keeps the uid from ever being reused: it is quarantined, not released."""
    monkeypatch.setattr(uid_pool, "CONTAIN_TIMEOUT_S", 1.0)
    before = set(uid_pool._quarantined)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_program, "import time\ntime.sleep(3)", Limits(timeout_s=10.0))
        deadline = time.monotonic() + 10
        while not (slots := set(uid_pool._uids_in_use)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (slot,) = slots
        stray.append(run_as(SANDBOX_UID_BASE + slot))
        result = running.result(timeout=30)
    try:
        assert result.passed
        assert uid_pool._quarantined - before == {slot}
        uids = {int(run_program("import os\nprint(os.getuid())").stdout_tail) for _ in range(3)}
        assert SANDBOX_UID_BASE + slot not in uids
    finally:
        with uid_pool._uid_lock:  # give it back, so that other tests in this process see a clean pool
            uid_pool._quarantined.discard(slot)
            claim = uid_pool._uid_claims.pop(slot, None)
            if claim is not None:
                claim.close()
