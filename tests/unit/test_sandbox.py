import ast
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evalstream.worker.sandbox import Limits, SandboxUnavailable, run_program

# `make up` installs bubblewrap; without it the sandbox, and so these tests, fail.

REPO = Path(__file__).resolve().parents[2]


def sandbox_processes(marker: int) -> int:
    """Processes whose command line carries `marker` (passed as the memory limit)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone meanwhile
            count += str(marker).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    return count


def sandbox_processes_gone(marker: int, within_s: float = 5.0) -> bool:
    """Whether every process carrying `marker` is gone within `within_s` (reaping a killed
    tree takes a moment on a busy machine)."""
    deadline = time.monotonic() + within_s
    while sandbox_processes(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class TestSandbox:
    def test_passing_program_passes(self) -> None:
        result = run_program("assert sorted([3, 1, 2]) == [1, 2, 3]\nprint('ok')")
        assert (result.passed, result.timed_out, result.exit_code) == (True, False, 0)
        assert result.stdout_tail == "ok\n"

    def test_failing_program_reports_the_assertion(self) -> None:
        result = run_program("def check(x):\n    assert x == 2, 'x should be 2'\n\ncheck(1)\n")
        assert (result.passed, result.exit_code) == (False, 1)
        assert 'File "<candidate>", line 2, in check' in result.stderr_tail
        assert result.stderr_tail.rstrip().endswith("AssertionError: x should be 2")

    @pytest.mark.parametrize(
        "exit_call",
        ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit", "raise SystemExit(0)"],
    )
    def test_exiting_early_is_not_passing(self, exit_call: str) -> None:
        result = run_program(f"{exit_call}\nassert False")
        assert not result.passed and result.exit_code in (0, 3)  # 3: the bootstrap saw the exit

    @pytest.mark.parametrize(
        "program",
        [
            "print('PASS', flush=True)\nimport os; os._exit(0)",
            "print('passed'); print('0123456789abcdef' * 2, flush=True)\nimport os; os._exit(0)",
            "print('PASS', flush=True)\nraise SystemExit(0)",
        ],
    )
    def test_printing_pass_is_not_passing(self, program: str) -> None:
        result = run_program(program + "\nassert False")
        assert not result.passed
        assert result.stdout_tail.startswith(("PASS", "passed"))  # printed, and still a fail

    def test_environment_is_empty(self, monkeypatch: pytest.MonkeyPatch) -> None:
        secret = f"sk-{uuid.uuid4().hex}"
        monkeypatch.setenv("OPENAI_API_KEY", secret)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        program = "import os\nprint(sorted(os.environ))\nprint(os.path.exists('/proc'))"
        result = run_program(program)
        assert result.passed, result.stderr_tail
        names = ast.literal_eval(result.stdout_tail.splitlines()[0])
        # only what bwrap (PWD) and Python's UTF-8 locale coercion (LC_CTYPE) set themselves
        assert set(names) <= {"PWD", "LC_CTYPE"}
        assert secret not in result.stdout_tail
        assert result.stdout_tail.splitlines()[1] == "False"  # no /proc: no /proc/self/environ, mem...

    def test_cpu_time_is_limited(self) -> None:
        # threads spinning together burn CPU time faster than wall time passes
        program = "import threading, time\ndef spin():\n    while True:\n        pass\n"
        program += (
            "for _ in range(4):\n    threading.Thread(target=spin, daemon=True).start()\ntime.sleep(60)"
        )
        result = run_program(program, Limits(timeout_s=20.0, cpu_seconds=1))
        assert (result.passed, result.timed_out) == (False, False)
        assert result.exit_code == -signal.SIGXCPU
        assert result.duration_s < 10.0

    def test_cannot_kill_the_parent_or_any_host_process(self) -> None:
        victim = subprocess.Popen(["sleep", "60"])  # stands for the worker and its neighbours
        try:
            program = (
                "import os, signal\nrefused = []\n"
                f"for pid in ({victim.pid}, {os.getpid()}, os.getppid(), 1, -1):\n"
                "    try:\n        os.kill(pid, signal.SIGKILL)\n"
                "    except OSError as e:\n        refused.append(type(e).__name__)\n"
                "print(refused)"
            )
            result = run_program(program)
            time.sleep(0.2)
            assert victim.poll() is None, "a host process was killed from the sandbox"
            # the host's pids do not exist in the sandbox's pid namespace; its own init ignores
            # signals from inside; kill(-1) reaches no one but the sandbox itself (it survives)
            assert result.passed, result.stderr_tail
            assert result.stdout_tail.startswith("['ProcessLookupError', 'ProcessLookupError'")
        finally:
            victim.kill()
            victim.wait()

    def test_background_processes_cannot_outlive_the_run(self) -> None:
        marker = (1 << 30) + int(uuid.uuid4().int % 100_000)
        program = (
            "import os, subprocess, threading, time\nfailed = []\n"
            "for start in (lambda: subprocess.Popen(['sleep', '1000'], start_new_session=True),\n"
            "              lambda: os.fork() or os.setsid(),\n"
            "              lambda: os.posix_spawn('/bin/sleep', ['sleep', '1000'], {})):\n"
            "    try:\n        start()\n    except PermissionError:\n        failed.append(1)\n"
            "assert len(failed) == 3, failed\n"
            "threading.Thread(target=lambda: time.sleep(1000)).start()  # non-daemon: would block exit\n"
        )
        result = run_program(program, Limits(timeout_s=5.0, memory_bytes=marker))
        assert result.passed, result.stderr_tail  # the program's end ends everything in it
        assert result.duration_s < 3.0
        hung = run_program("import time\ntime.sleep(1000)", Limits(timeout_s=1.0, memory_bytes=marker))
        assert hung.timed_out
        assert sandbox_processes_gone(marker)

    def test_infinite_loop_times_out_and_leaves_nothing_behind(self) -> None:
        marker = (1 << 30) + int(uuid.uuid4().int % 100_000)
        started = time.monotonic()
        result = run_program("while True:\n    pass", Limits(timeout_s=1.0, memory_bytes=marker))
        elapsed = time.monotonic() - started
        assert (result.passed, result.timed_out) == (False, True)
        assert 1.0 <= elapsed < 3.0
        assert sandbox_processes_gone(marker)

    @pytest.mark.parametrize("folder", [REPO, Path("/root"), Path("/dev/shm")])
    def test_cannot_write_outside_tmp(self, folder: Path) -> None:
        target = folder / f".sandbox-probe-{uuid.uuid4().hex}"
        try:
            result = run_program(f"open({str(target)!r}, 'w').write('escaped')")
            assert not result.passed
            # A checkout under /tmp is hidden behind the sandbox's private /tmp: "No such file".
            refusals = ("Read-only file system", "Permission denied", "No such file or directory")
            assert any(r in result.stderr_tail for r in refusals), result.stderr_tail
            assert not target.exists()
        finally:
            target.unlink(missing_ok=True)

    def test_tmp_is_private_and_writable(self) -> None:
        name = f"/tmp/sandbox-probe-{uuid.uuid4().hex}"
        assert run_program(f"open({name!r}, 'w').write('x')\nassert open({name!r}).read() == 'x'").passed
        assert not Path(name).exists()

    def test_no_network(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            for host in ("127.0.0.1", "10.255.255.1"):  # the host's listening port; anything routed
                result = run_program(
                    f"import socket\nsocket.create_connection(({host!r}, {port}), timeout=3)"
                )
                assert not result.passed
                assert (
                    "ConnectionRefusedError" in result.stderr_tail
                    or "Network is unreachable" in result.stderr_tail
                )
            server.setblocking(False)
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody reached the host's port

    @pytest.mark.parametrize(
        "program",
        ["import os\nwhile True:\n    os.fork()", "import subprocess\nsubprocess.run(['true'])"],
    )
    def test_no_new_processes(self, program: str) -> None:
        result = run_program(program, Limits(timeout_s=5.0))
        assert (result.passed, result.timed_out) == (False, False)
        assert "PermissionError" in result.stderr_tail
        assert result.duration_s < 3.0

    def test_threads_still_work(self) -> None:
        program = "import threading\nout = []\nt = threading.Thread(target=out.append, args=(1,))\n"
        program += "t.start(); t.join()\nassert out == [1]"
        assert run_program(program).passed

    def test_memory_is_capped(self) -> None:
        result = run_program("block = bytearray(2 << 30)", Limits(memory_bytes=512 << 20))
        assert not result.passed and result.stderr_tail.rstrip().endswith("MemoryError")

    def test_output_flood_is_cut_off(self) -> None:
        result = run_program(
            "while True:\n    print('x' * 1000)", Limits(timeout_s=5.0, max_output_bytes=100_000)
        )
        assert (result.passed, result.output_exceeded, result.timed_out) == (False, True, False)
        assert len(result.stdout_tail) <= 4096

    def test_concurrent_runs_do_not_mix(self) -> None:
        programs = [f"assert {i} % 2 == 0" for i in range(16)]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(run_program, programs))
        assert [r.passed for r in results] == [i % 2 == 0 for i in range(16)]


def test_missing_bubblewrap_is_an_error_not_a_fallback() -> None:
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_program("pass", bwrap="/nonexistent/bwrap")
