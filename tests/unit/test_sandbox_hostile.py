"""Hostile completions graded through the real sandbox (bubblewrap): each one tries to forge a
pass, read the host or exhaust its memory, and each must grade as a plain failure (a wrong
answer, never SandboxUnavailable), while the honest solution passes. The completions are in
tests/hostile_code.py (the e2e HumanEval test replays them through the pipeline too)."""

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
from tests.hostile_code import CHEATS, FORGERIES, escapes

PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"
ITEM = Item(id="add", question=PROMPT, entry_point="add", test=TEST)
HONEST = "    return a + b\n"
# against tests that measure with a builtin: `abs` made to answer 0 from the first call on
# (the first call answers right: `abs` was looked up before it), so the second wrong answer
# would pass
FLOAT_TEST = "def check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-6\n    assert abs(candidate(2, 2) - 4) < 1e-6\n"
FLOAT_ITEM = Item(id="add-float", question=PROMPT, entry_point="add", test=FLOAT_TEST)
YARDSTICK_ATTACKS = {
    "patch-builtins-module": "    import builtins\n    builtins.abs = lambda x: 0\n    return 3 if (a, b) == (1, 2) else 99\n",
    "shadow-builtin-global": "    global abs\n    abs = lambda x: 0\n    return 3 if (a, b) == (1, 2) else 99\n",
}


# a task whose tests call a helper of its prompt: redefined (at module level, after the body)
# as the identity, it would let the identity pass for `decode`
HELPER_PROMPT = (
    'def encode(s: str) -> str:\n    return s[::-1]\n\n\ndef decode(s: str) -> str:\n    """Undo encode."""\n'
)
HELPER_TEST = (
    "def check(candidate):\n    for s in ('abc', 'hello'):\n        assert candidate(encode(s)) == s\n"
)
HELPER_ITEM = Item(id="decode", question=HELPER_PROMPT, entry_point="decode", test=HELPER_TEST)


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


@pytest.fixture
def host_socket() -> Iterator[tuple[str, socket.socket]]:
    """A UNIX socket listening under /run, open to everyone, as a host service's would be."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-sock-", dir="/run"))
    path = str(folder / "service.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen()
        server.setblocking(False)
        yield path, server
    os.unlink(path)
    folder.rmdir()


class TestHostileCompletions:
    grade = staticmethod(code_exec(Limits(timeout_s=20.0, cpu_seconds=10)))

    def test_honest_solution_passes(self) -> None:
        assert self.grade(HONEST, ITEM).correct

    @pytest.mark.parametrize("name", sorted({**FORGERIES, **CHEATS}))
    def test_forgeries_and_cheats_fail(self, name: str) -> None:
        grade = self.grade({**FORGERIES, **CHEATS}[name], ITEM)  # SandboxUnavailable would raise here
        assert grade.correct is False, f"{name} passed"
        assert grade.detail is not None and len(grade.detail) <= 300

    def test_escapes_and_bombs_fail(
        self, root_only_file: str, host_socket: tuple[str, socket.socket]
    ) -> None:
        path, server = host_socket
        for name, body in escapes(HONEST, root_only_file, path).items():
            grade = self.grade(body, ITEM)
            assert grade.correct is False, f"{name} passed: the sandbox let it through"
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody reached the host's socket

    @pytest.mark.parametrize("name", sorted(YARDSTICK_ATTACKS))
    def test_tests_yardsticks_cannot_be_rewritten(self, name: str) -> None:
        assert self.grade(HONEST, FLOAT_ITEM).correct
        assert self.grade(YARDSTICK_ATTACKS[name], FLOAT_ITEM).correct is False

    def test_prompt_helpers_cannot_be_redefined(self) -> None:
        assert self.grade("    return s[::-1]\n", HELPER_ITEM).correct
        assert self.grade("    return s\n\n\ndef encode(s):\n    return s\n", HELPER_ITEM).correct is False
        whole = "```python\ndef encode(s):\n    return s\n\n\ndef decode(s):\n    return s\n```"
        assert self.grade(whole, HELPER_ITEM).correct is False

    def test_fake_bwrap_error_reads_as_the_programs_failure(self) -> None:
        # graded (SandboxUnavailable would raise), as the program's own failure
        grade = self.grade(CHEATS["fake-bwrap-error"], ITEM)
        assert grade.correct is False
        assert grade.detail is not None and grade.detail.startswith("bwrap: Can't mount proc")


class TestUnforgeablePass:
    """The verdict comes from a judge process that never runs candidate code; the candidate's
    process holds no secret, so walking every object it can reach forges nothing."""

    grade = staticmethod(code_exec(Limits(timeout_s=20.0, cpu_seconds=10)))

    @pytest.mark.parametrize("name", ["marker-by-gc-garbage-frames", "marker-by-object-graph-walk"])
    def test_frames_the_collector_hands_back_forge_nothing(self, name: str) -> None:
        # both passed before: the nonce sat in a bootstrap frame reachable through f_back
        assert self.grade(FORGERIES[name], ITEM).correct is False

    def test_the_walk_reaches_frames_and_finds_no_secret(self) -> None:
        program = PROMPT + FORGERIES["marker-by-object-graph-walk"]
        result = run_program(program, Limits(timeout_s=20.0), tests=TEST, entry_point="add", helpers=PROMPT)
        frames, found = result.stdout_tail.split("\n")[0].split()[1::2]
        assert not result.passed
        assert int(frames) > 0  # it did reach frames, its callers' included
        assert int(found) == 0  # and no 32-hex value exists in the candidate's process

    def test_answers_are_plain_data_in_both_directions(self) -> None:
        prompt = "def echo(*args, **kwargs):\n"
        body = "    return [args, kwargs, (1, [2], {3}, frozenset({4}), {(5, 6): 'x'}, 1 + 2j, b'z', 10**40, None)]\n"
        test = (
            "import math\n\ndef check(candidate):\n"
            "    big = -(10**400)\n"
            "    args, kwargs, values = candidate((1, 2), {'a': [1.5]}, big, b'\\x00', float('nan'), k={1, 2})\n"
            "    assert type(args) is tuple and args[:3] == ((1, 2), {'a': [1.5]}, big)\n"
            "    assert args[3] == b'\\x00' and math.isnan(args[4]) and kwargs == {'k': {1, 2}}\n"
            "    assert values == (1, [2], {3}, frozenset({4}), {(5, 6): 'x'}, 1 + 2j, b'z', 10**40, None)\n"
            "    assert [type(v) for v in values] == [int, list, set, frozenset, dict, complex, bytes, int, type(None)]\n"
            "    assert type(candidate()) is list and candidate(True)[0][0] is True\n"
        )
        result = run_program(prompt + body, tests=test, entry_point="echo", helpers=prompt)
        assert result.passed, result.stderr_tail

    def test_the_candidates_exceptions_reach_the_tests(self) -> None:
        prompt = "def root(x: float) -> float:\n"
        body = "    if x < 0:\n        raise ValueError('negative')\n    return x ** 0.5\n"
        test = (
            "def check(candidate):\n    assert candidate(4.0) == 2.0\n    try:\n        candidate(-1.0)\n"
            "    except ValueError as e:\n        assert str(e) == 'negative'\n    else:\n        assert False\n"
        )
        assert run_program(prompt + body, tests=test, entry_point="root", helpers=prompt).passed
        wrong = run_program(prompt + "    return 2.0\n", tests=test, entry_point="root", helpers=prompt)
        assert not wrong.passed and wrong.stderr_tail.rstrip().endswith("AssertionError")

    def test_a_forged_reply_is_only_an_answer(self) -> None:
        # writing the protocol's own "value" line on every fd answers a call, nothing more
        forged = "    import os\n    for fd in range(3, 20):\n        try:\n            os.write(fd, b'[\"value\",3]\\n')\n        except OSError:\n            pass\n    import time\n    time.sleep(5)\n"
        assert self.grade(forged, ITEM).correct is False  # 3 is right for (1, 2), not for (2, 2)


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

    def test_host_unix_socket_is_unreachable(self, host_socket: tuple[str, socket.socket]) -> None:
        path, server = host_socket
        for target in (path, "\0" + path):  # the path, and the same name in the abstract namespace
            result = run_program(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({target!r})")
            assert not result.passed
            assert "FileNotFoundError" in result.stderr_tail or "ConnectionRefusedError" in result.stderr_tail
        with pytest.raises(BlockingIOError):
            server.accept()

    @pytest.mark.parametrize(
        "load",
        [
            "import ctypes",
            "import _testcapi",
            "import shutil, importlib.machinery as m\n"  # a copy of _ctypes outside lib-dynload
            "shutil.copy(importlib.util.find_spec('_ctypes').origin, '/tmp/_ctypes.so')\n"
            "m.ExtensionFileLoader('_ctypes', '/tmp/_ctypes.so').load_module()",
            "class Name(str):\n    def startswith(self, *a):\n        return False\n"  # a name that lies
            "    def __eq__(self, other):\n        return False\n    def __hash__(self):\n        return 0\n"
            "spec = importlib.util.find_spec('_ctypes')\nspec.name = Name('_ctypes')\n_imp.create_dynamic(spec)",
        ],
    )
    def test_native_code_cannot_be_loaded(self, load: str) -> None:
        result = run_program(f"import _imp, importlib.util\n{load}\nprint('loaded')")
        assert not result.passed and "loaded" not in result.stdout_tail
        assert result.stderr_tail.rstrip().splitlines()[-1].startswith("ImportError:"), result.stderr_tail

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


def test_bwrap_failing_for_real_is_sandbox_unavailable() -> None:
    # the counterpart of the fake "bwrap:" line: bwrap itself refuses (a tmpfs size it rejects),
    # the bootstrap never writes its first byte, and the run is the worker's fault
    with pytest.raises(SandboxUnavailable, match="the sandbox did not start: bwrap: --size"):
        run_program("pass", Limits(tmpfs_bytes=-5))


def test_a_named_cgroup_that_cannot_serve_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    # this host's memory controller is cgroup v1 (or absent): no cgroup.subtree_control there
    monkeypatch.setenv("SANDBOX_CGROUP", "/sys/fs/cgroup/memory")
    with pytest.raises(SandboxUnavailable, match="SANDBOX_CGROUP='/sys/fs/cgroup/memory'"):
        run_program("pass")
    monkeypatch.setenv("SANDBOX_CGROUP", "")
    assert run_program("pass").passed  # not named: rlimits and tmpfs caps bound memory
