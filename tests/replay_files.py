"""Where tests and benchmarks put `replay:` files (importable as tests.replay_files).

A worker reads replay files only under its REPLAY_ROOT (worker/engines/replay.py), and the
local stack gives its workers <stack>/replay (ops/local/stack.py): answers a test replays go
there, in a folder of their own, and a worker a test starts gets the same root
(`replay_env()`). This process's REPLAY_ROOT, when set, is the root instead.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PREFIX = "t-"  # folders made here; those older than a week are removed as new ones are made
_KEEP_S = 7 * 24 * 3600


def replay_root() -> Path:
    """The REPLAY_ROOT of the stack's workers (read when called: benchmarks pick their stack
    at run time)."""
    explicit = os.environ.get("REPLAY_ROOT")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("EVALSTREAM_STACK") or ROOT / ".stack") / "replay"


def replay_env() -> dict[str, str]:
    """The environment a worker started by a test needs to read the files put here."""
    return {"REPLAY_ROOT": str(replay_root())}


def replay_dir(tag: str = "test") -> Path:
    """A new, empty folder under the replay root for one test's files."""
    root = replay_root()
    root.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - _KEEP_S
    for old in root.glob(f"{_PREFIX}*"):
        try:
            if old.is_dir() and not old.is_symlink() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:  # another test run removed it meanwhile
            continue
    folder = root / f"{_PREFIX}{tag}-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    return folder
