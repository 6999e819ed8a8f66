"""Where the benchmarks live and write, and which stack they may use."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PY = ROOT / ".venv" / "bin" / "python"
STACK_PY = ROOT / "ops" / "local" / "stack.py"
BENCH_OFFSET = 4000
# The development stack and the fault suite's: benchmarks never run there.
FORBIDDEN_OFFSETS = (0, 2000)
DEFAULT_MODEL = "hf:smollm2-135m-instruct"
README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def pip_install(python: Path, *requirements: str, **run: Any) -> None:
    """`pip install` into one of the benchmarks' side venvs (lm-eval's, cleanlab's): quiet,
    no version nag; `run` goes to subprocess.run (capture_output, timeout)."""
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        check=True,
        **run,
    )
