"""`replay:` files are read only under the operator's REPLAY_ROOT (issue 26).

The attack: a job naming `replay:<a .jsonl anywhere on the worker's host>` had that file's
lines served as the run's answers, so its content reached the results. Planted here for real:
a file in root's home (by its absolute path), a symlink to it from the temporary folder, the
same file as `~/...`, and a symlink inside the root leading out of it. Each is refused,
through the engine loader, the worker's engine registry and a replay judge alike, and no
error says anything of the file's content. A file under the root is served.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalstream.common.messages import GenerationParams, Item
from evalstream.common.settings import Settings
from evalstream.worker.engine_registry import Engines
from evalstream.worker.engines import EngineConfigError, load_engine, validate_spec
from evalstream.worker.engines.base import GenOutput, GenRequest, PermanentEngineError
from evalstream.worker.engines.replay import ReplayEngine
from evalstream.worker.grading import get_grader

SECRET = f"planted-{uuid.uuid4().hex}"
ANSWERS = [{"id": "q1", "response": SECRET}]


def settings(root: Path | str) -> Settings:
    return Settings(worker_model="null,replay:*", replay_root=str(root))


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def planted() -> Iterator[Path]:
    """A .jsonl in root's home (the worker's, in these tests), named uniquely."""
    home = Path(os.path.expanduser("~"))
    path = write_jsonl(home / f"evalstream-planted-{uuid.uuid4().hex}.jsonl", ANSWERS)
    yield path
    path.unlink()


@pytest.fixture
def tmp_link(planted: Path) -> Iterator[Path]:
    """A symlink in the temporary folder to the planted file."""
    link = Path(tempfile.gettempdir()) / f"evalstream-link-{uuid.uuid4().hex}.jsonl"
    link.symlink_to(planted)
    yield link
    link.unlink()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "replay-root"
    folder.mkdir()
    return folder


def served(engine: object) -> str:
    assert isinstance(engine, ReplayEngine)
    (out,) = engine.generate([GenRequest(item_id="q1", messages=[], params=GenerationParams())])
    assert isinstance(out, GenOutput)
    return out.text


def refused(spec: str, root: Path | str) -> str:
    """The error loading `spec` gives, through the loader and the engine registry (the way
    a worker meets a job's SPEC), which must say nothing of the planted content."""
    with pytest.raises(EngineConfigError) as loaded:
        load_engine(spec, settings(root))
    with pytest.raises(EngineConfigError) as registered:
        Engines(settings(root))(spec)
    problem = validate_spec(spec, check_files=True, replay_root=str(root))
    for message in (str(loaded.value), str(registered.value), problem or ""):
        assert SECRET not in message
    assert problem is not None
    return str(loaded.value)


def test_a_file_in_roots_home_is_refused(planted: Path, root: Path) -> None:
    assert "read only under REPLAY_ROOT" in refused(f"replay:{planted}", root)


def test_a_symlink_in_the_temporary_folder_is_refused(tmp_link: Path, root: Path) -> None:
    assert "read only under REPLAY_ROOT" in refused(f"replay:{tmp_link}", root)


def test_home_is_not_expanded(planted: Path, root: Path) -> None:
    assert "'~' is not expanded" in refused(f"replay:~/{planted.name}", root)


def test_a_symlink_inside_the_root_leading_out_is_refused(planted: Path, root: Path) -> None:
    (root / "inside.jsonl").symlink_to(planted)
    (root / "sub").symlink_to(planted.parent, target_is_directory=True)
    assert "read only under REPLAY_ROOT" in refused("replay:inside.jsonl", root)
    assert "read only under REPLAY_ROOT" in refused(f"replay:sub/{planted.name}", root)
    assert "read only under REPLAY_ROOT" in refused(f"replay:{root}/inside.jsonl", root)


def test_outside_the_root_reads_the_same_whether_or_not_the_file_exists(planted: Path, root: Path) -> None:
    there = refused(f"replay:{planted}", root)
    absent = refused(f"replay:{planted.parent}/absent-{uuid.uuid4().hex}.jsonl", root)
    assert there.split(":", 2)[2] == absent.split(":", 2)[2]  # after "replay:<path>:"


def test_no_root_no_replay_files(planted: Path, root: Path) -> None:
    write_jsonl(root / "answers.jsonl", ANSWERS)
    for spec in (f"replay:{planted}", f"replay:{root}/answers.jsonl", "replay:answers.jsonl"):
        assert "REPLAY_ROOT is not set" in refused(spec, "")


def test_a_file_under_the_root_is_served(root: Path) -> None:
    path = write_jsonl(root / "answers.jsonl", ANSWERS)
    (root / "runs").mkdir()
    (root / "runs" / "latest.jsonl").symlink_to(path)  # a symlink that stays inside: fine
    for spec in (f"replay:{path}", "replay:answers.jsonl", "replay:runs/latest.jsonl"):
        engine = load_engine(spec, settings(root))
        assert served(engine) == SECRET and engine.name == spec


def test_a_fifo_and_a_folder_under_the_root_are_refused_at_once(root: Path) -> None:
    os.mkfifo(root / "pipe.jsonl")  # opening it for reading would block without O_NONBLOCK
    (root / "folder.jsonl").mkdir()
    assert "not found" in refused("replay:pipe.jsonl", root)
    assert "not found" in refused("replay:folder.jsonl", root)


def test_a_file_over_the_cap_is_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalstream.worker.engines import replay

    monkeypatch.setattr(replay, "REPLAY_MAX_BYTES", 64)
    write_jsonl(root / "big.jsonl", ANSWERS * 4)
    with pytest.raises(EngineConfigError, match="over the 64-byte limit"):
        load_engine("replay:big.jsonl", settings(root))


def test_a_folder_swapped_for_a_symlink_after_resolving_is_caught(
    planted: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: the path resolves inside the root, then a folder on it becomes a symlink
    out of it before the file is opened. The path the kernel opened is checked again."""
    from evalstream.worker.engines import replay

    (root / "d").mkdir()
    write_jsonl(root / "d" / planted.name, [{"id": "q1", "response": "harmless"}])
    resolve = replay.replay_file

    def resolve_then_swap(target: str, where: str) -> Path:
        path = resolve(target, where)
        (root / "d" / planted.name).unlink()
        (root / "d").rmdir()
        (root / "d").symlink_to(planted.parent, target_is_directory=True)
        return path

    monkeypatch.setattr(replay, "replay_file", resolve_then_swap)
    with pytest.raises(EngineConfigError, match="read only under REPLAY_ROOT") as caught:
        ReplayEngine(f"d/{planted.name}", root=str(root))
    assert SECRET not in str(caught.value)


def test_a_replay_judge_is_rooted_too(planted: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_MODEL", "null,replay:*")
    monkeypatch.setenv("REPLAY_ROOT", str(root))
    with pytest.raises(EngineConfigError, match="read only under REPLAY_ROOT") as caught:
        get_grader(f"judge:replay:{planted}")
    assert SECRET not in str(caught.value)
    name = f"verdicts-{uuid.uuid4().hex}.jsonl"  # graders are cached by SPEC
    write_jsonl(root / name, [{"id": "a", "response": "VERDICT: CORRECT"}])
    grade = get_grader(f"judge:replay:{name}")
    assert grade("Paris", Item(id="a", question="Capital of France?", answer="Paris")).correct
    with pytest.raises(PermanentEngineError):
        grade("?", Item(id="zzz"))
