"""Where the benchmarks live and write, and which stack they may use."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PY = ROOT / ".venv" / "bin" / "python"
STACK_PY = ROOT / "ops" / "local" / "stack.py"
BENCH_OFFSET = 4000
# The development stack and the fault suite's: benchmarks never run there.
FORBIDDEN_OFFSETS = (0, 2000)
DEFAULT_MODEL = "hf:smollm2-135m-instruct"
README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"
