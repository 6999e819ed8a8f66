"""Hostile completions graded through the real sandbox (bubblewrap): each one tries to forge a
pass, read the host or exhaust its memory, and each must grade as a plain failure (a wrong
answer, never SandboxUnavailable), while the honest solution passes."""

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalstream.common.messages import Item
from evalstream.worker.grading.code_exec import code_exec
from evalstream.worker.sandbox import Limits, SandboxUnavailable, run_program

PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
ITEM = Item(id="add", question=PROMPT, entry_point="add", test=TEST)
HONEST = "    return a + b\n"
FIND_NONCE = (
    "    import re, os\n    found = set()\n"
    "    def scan(d):\n"
    "        for v in list(d.values()):\n"
    "            if isinstance(v, (str, bytes)) and re.fullmatch(rb'[0-9a-f]{32}', v if isinstance(v, bytes) else v.encode()):\n"
    "                found.add(v if isinstance(v, bytes) else v.encode())\n"
)
FORGE = "    for n in found:\n        for fd in range(3, 20):\n            try: os.write(fd, n)\n            except OSError: pass\n        print('\\n' + n.decode(), flush=True)\n    os._exit(0)\n"

# name -> a body for `add` (each either forges a pass or attacks the host and returns wrong)
ATTACKS = {
    "main-globals": FIND_NONCE + "    import __main__\n    scan(vars(__main__))\n" + FORGE,
    "getframe-walk": FIND_NONCE
    + "    import sys\n    f = sys._getframe()\n    while f:\n        scan(f.f_locals)\n        f = f.f_back\n"
    + FORGE,
    "traceback-frame": FIND_NONCE
    + "    try:\n        raise ValueError\n    except ValueError as e:\n        f = e.__traceback__.tb_frame\n"
    + "    while f:\n        scan(f.f_locals)\n        f = f.f_back\n"
    + FORGE,
    "generator-frame": FIND_NONCE
    + "    def g():\n        yield 1\n    f = g().gi_frame\n    while f:\n        scan(f.f_locals)\n        f = f.f_back\n"
    + FORGE,
    "current-frames": FIND_NONCE
    + "    import sys\n    for f in sys._current_frames().values():\n        while f:\n"
    + "            scan(f.f_locals)\n            f = f.f_back\n"
    + FORGE,
    "inspect-stack": FIND_NONCE
    + "    import inspect\n    for info in inspect.stack():\n        scan(info.frame.f_locals)\n"
    + FORGE,
    "gc-objects": FIND_NONCE
    + "    import gc\n    for o in gc.get_objects():\n        if isinstance(o, dict):\n            scan(o)\n"
    + FORGE,
    "settrace": "    import sys\n    sys.settrace(lambda *a: None)\n    return 0\n",
    "signal-frame": FIND_NONCE
    + "    import signal, time\n    frames = []\n    signal.signal(signal.SIGALRM, lambda s, f: frames.append(f))\n"
    + "    signal.setitimer(signal.ITIMER_REAL, 0.01)\n    time.sleep(0.1)\n"
    + "    for f in frames:\n        while f:\n            scan(f.f_locals)\n            f = f.f_back\n"
    + FORGE,
    "ctypes": "    import ctypes\n    return ctypes.string_at(id(a), 8) and 0\n",
    "proc-self-mem": "    import re, os\n    found = set()\n    regions = [line.split() for line in open('/proc/self/maps')]\n"
    "    mem = open('/proc/self/mem', 'rb', 0)\n    for r in regions:\n"
    "        lo, hi = (int(x, 16) for x in r[0].split('-'))\n"
    "        if 'rw' not in r[1] or hi - lo > 1 << 26:\n            continue\n"
    "        try:\n            mem.seek(lo)\n            data = mem.read(hi - lo)\n        except OSError:\n            continue\n"
    "        found.update(re.findall(rb'([0-9a-f]{32})\\ndef add', data))\n"
    '        found.update(re.findall(rb\'"nonce": "([0-9a-f]{32})"\', data))\n' + FORGE,
    "code-replace": "    f = lambda: 0\n    f.__code__ = f.__code__.replace(co_code=b'd\\xff' * 4)\n    return f()\n",
    "read-tests-from-linecache": "    import linecache, re\n    src = ''.join(linecache.getlines('<candidate>'))\n"
    "    table = dict(re.findall(r'candidate\\((.*?)\\) == (\\S+)', src))\n"
    "    return eval(table[repr((a, b))[1:-1]])\n",
    "always-equal": "    class Eq(int):\n        def __eq__(self, other):\n            return True\n    return Eq(0)\n",
    "always-equal-in-list": "    class Eq:\n        def __eq__(self, other):\n            return True\n    return [Eq()][0]\n",
    "early-exit-zero": "    import os\n    os._exit(0)\n",
    "system-exit-zero": "    raise SystemExit(0)\n",
    "print-fake-marker": "    import sys\n    print('\\n' + '0' * 32)\n    sys.stdout.flush()\n    import os\n    os._exit(0)\n",
    "monkeypatch-stdout": "    import sys, io\n    sys.stdout = io.StringIO()\n    print = None\n    return 0\n",
    "fake-bwrap-error": "    import sys, os\n    sys.stderr.write('bwrap: Can\\'t mount proc\\n')\n    sys.stderr.flush()\n    os._exit(1)\n",
    "memfd-bomb": "    import os\n    fds = [os.memfd_create('x') for _ in range(60)]\n    return 0\n",
    "dev-shm-bomb": "    open('/dev/shm/x', 'wb').write(b'x' * (1 << 30))\n    return 0\n",
    "tmp-bomb": "    for i in range(1000):\n        open(f'/tmp/f{i}', 'wb').write(b'x' * (8 << 20))\n    return 0\n",
    "thread-bomb": "    import threading, time\n    ts = []\n    for _ in range(10000):\n"
    "        t = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n        t.start()\n        ts.append(t)\n    return 0\n",
}


# against tests that measure with a builtin: `abs` made to answer 0 from the first call on
# (the first call answers right: `abs` was looked up before it), so the second wrong answer
# would pass
FLOAT_TEST = "def check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-6\n    assert abs(candidate(2, 2) - 4) < 1e-6\n"
FLOAT_ITEM = Item(id="add-float", question=PROMPT, entry_point="add", test=FLOAT_TEST)
YARDSTICK_ATTACKS = {
    "patch-builtins-module": "    import builtins\n    builtins.abs = lambda x: 0\n    return 3 if (a, b) == (1, 2) else 99\n",
    "shadow-builtin-global": "    global abs\n    abs = lambda x: 0\n    return 3 if (a, b) == (1, 2) else 99\n",
}


@pytest.fixture
def root_only_file() -> Iterator[str]:
    """A file only root may read, in a host folder (the tests run as root here)."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-host-", dir="/var/tmp"))
    secret = folder / "secret"
    secret.write_text("host-secret")
    secret.chmod(0o600)
    yield str(secret)
    secret.unlink()
    folder.rmdir()


class TestHostileCompletions:
    grade = staticmethod(code_exec(Limits(timeout_s=20.0, cpu_seconds=10)))

    def test_honest_solution_passes(self) -> None:
        assert self.grade(HONEST, ITEM).correct

    @pytest.mark.parametrize("name", sorted(ATTACKS))
    def test_attack_is_a_plain_failure(self, name: str) -> None:
        grade = self.grade(ATTACKS[name], ITEM)  # SandboxUnavailable would raise here
        assert grade.correct is False, f"{name} passed"
        assert grade.detail is not None and len(grade.detail) <= 300

    @pytest.mark.parametrize("name", sorted(YARDSTICK_ATTACKS))
    def test_tests_yardsticks_cannot_be_rewritten(self, name: str) -> None:
        assert self.grade(HONEST, FLOAT_ITEM).correct
        assert self.grade(YARDSTICK_ATTACKS[name], FLOAT_ITEM).correct is False

    def test_fake_bwrap_error_reads_as_the_programs_failure(self) -> None:
        # graded (SandboxUnavailable would raise), as the program's own failure
        grade = self.grade(ATTACKS["fake-bwrap-error"], ITEM)
        assert (grade.correct, grade.detail) == (False, "bwrap: Can't mount proc")


class TestHostIsolation:
    def test_runs_as_an_unprivileged_uid(self) -> None:
        result = run_program("import os\nprint(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())")
        assert result.passed, result.stderr_tail
        uid, euid, gid, groups = result.stdout_tail.split(maxsplit=3)
        assert uid == euid != "0" and gid != "0" and groups.strip() == "[]"

    def test_root_only_file_and_host_folders_are_invisible(self, root_only_file: str) -> None:
        secret = root_only_file
        # (/root itself shows where the interpreter lives under it, e.g. pyenv's: nothing else)
        paths = [secret, "/etc", "/run", "/proc", "/home", str(Path.cwd()), "/var", "/root/.cache", "/work"]
        program = f"import os\nprint([os.path.exists(p) for p in {paths!r}])\n"
        program += f"open({secret!r}).read()"
        result = run_program(program)
        assert not result.passed
        assert result.stdout_tail.strip() == str([False] * len(paths))
        assert "FileNotFoundError" in result.stderr_tail or "PermissionError" in result.stderr_tail
        assert "host-secret" not in result.stdout_tail + result.stderr_tail

    def test_host_unix_socket_is_unreachable(self) -> None:
        folder = Path(tempfile.mkdtemp(prefix="sandbox-sock-", dir="/run"))
        path = str(folder / "service.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(path)
            os.chmod(path, 0o777)
            server.listen()
            server.setblocking(False)
            for target in (path, "\0" + path):  # the path, and the same name in the abstract namespace
                result = run_program(
                    f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({target!r})\nprint('connected')"
                )
                assert not result.passed and "connected" not in result.stdout_tail
            with pytest.raises(BlockingIOError):
                server.accept()  # nobody reached the host's socket
        os.unlink(path)
        folder.rmdir()

    def test_threads_are_bounded(self) -> None:
        program = (
            "import threading, time\nn = 0\ntry:\n    for _ in range(10000):\n"
            "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n        n += 1\n"
            "except RuntimeError:\n    pass\nprint(n)"
        )
        result = run_program(program, Limits(max_threads=16))
        assert result.passed, result.stderr_tail
        assert int(result.stdout_tail) < 16

    def test_memory_outside_the_heap_is_refused(self) -> None:
        program = (
            "import os\nrefused = []\n"
            "for attempt in (lambda: os.memfd_create('x'), lambda: open('/dev/shm/x', 'wb')):\n"
            "    try:\n        attempt()\n    except OSError as e:\n        refused.append(type(e).__name__)\n"
            "print(refused)"
        )
        result = run_program(program)
        assert result.passed, result.stderr_tail
        assert result.stdout_tail.strip() == "['PermissionError', 'OSError']"

    def test_private_tmp_is_size_capped(self) -> None:
        program = "open('/tmp/big', 'wb').write(b'x' * (8 << 20))"
        result = run_program(program, Limits(tmpfs_bytes=4 << 20))
        assert not result.passed and "No space left on device" in result.stderr_tail

    def test_marker_unknown_to_the_program_forges_nothing(self) -> None:
        marker = uuid.uuid4().hex
        result = run_program(
            f"import os\nprint({marker!r}, flush=True)\nfor fd in range(3, 30):\n"
            "    try: os.write(fd, b'S' + b'0' * 32)\n    except OSError: pass\nos._exit(0)"
        )
        assert not result.passed and marker in result.stdout_tail


def test_a_named_cgroup_that_cannot_serve_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    # this host's memory controller is cgroup v1 (or absent): no cgroup.subtree_control there
    monkeypatch.setenv("SANDBOX_CGROUP", "/sys/fs/cgroup/memory")
    with pytest.raises(SandboxUnavailable, match="SANDBOX_CGROUP='/sys/fs/cgroup/memory'"):
        run_program("pass")
    monkeypatch.setenv("SANDBOX_CGROUP", "")
    assert run_program("pass").passed  # not named: rlimits and tmpfs caps bound memory
