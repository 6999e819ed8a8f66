"""Shared plumbing of the benchmarks: the bench stack, timing, process accounting, results.

Every benchmark runs against a stack of its own (ports shifted by EVALSTREAM_PORT_OFFSET,
default 4000; folder .stack-bench/), never the development stack (offset 0) or the fault
suite's (offset 2000). Absolute times on a shared 2-core machine are noisy, so headline
figures are ratios of two things measured in the same run, repeated, median quoted.

The helpers at the top (parsing /proc, Prometheus text, statistics, the README table) are
pure and unit-tested in tests/unit/test_bench_common.py; the rest talks to the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
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
SERVICE_PORTS = {"producer": 8101, "router": 8102, "aggregator": 8104, "worker": 8110}
DEFAULT_MODEL = "hf:smollm2-135m-instruct"
README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


# =========================================================================== pure helpers


def parse_proc_stat(text: str) -> dict[str, int]:
    """/proc/<pid>/stat → ppid and CPU ticks (utime, stime, cutime, cstime). The command
    name (field 2) may contain spaces and parentheses, so fields are counted from the last
    ')'."""
    rest = text.rsplit(")", 1)[1].split()
    # rest[0] is field 3 (state): field n is rest[n - 3]
    return {
        "ppid": int(rest[1]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "cutime": int(rest[13]),
        "cstime": int(rest[14]),
    }


def parse_status_kib(text: str, key: str) -> int | None:
    """A `Key:   1234 kB` line of /proc/<pid>/status, in KiB (None if absent)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            parts = value.split()
            return int(parts[0]) if parts else None
    return None


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name":
            return value.strip()
    return platform.processor() or "unknown"


def mem_total_bytes(meminfo: str) -> int | None:
    kib = parse_status_kib(meminfo, "MemTotal")
    return kib * 1024 if kib is not None else None


def git_commit(git_dir: Path) -> str | None:
    """HEAD's commit, read from the files (no git process): a detached HEAD, a loose ref or
    a packed one."""
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head or None
    ref = head.removeprefix("ref:").strip()
    with contextlib.suppress(OSError):
        return (git_dir / ref).read_text().strip()
    with contextlib.suppress(OSError):
        for line in (git_dir / "packed-refs").read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref:
                return sha
    return None


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median (the headline), min, max and every value, rounded for reading."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None, "values": []}
    return {
        "n": len(values),
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "values": [round(v, 4) for v in values],
    }


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Pairwise a/b of measurements taken side by side (repeat i of each)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators for {len(denominators)} denominators")
    return [a / b for a, b in zip(numerators, denominators, strict=True) if b]


MetricKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_prometheus(text: str) -> dict[MetricKey, float]:
    """Prometheus text exposition → {(sample name, sorted labels): value}."""
    out: dict[MetricKey, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            labels_text, _, value_text = rest.rpartition("}")
            labels = tuple(sorted(_parse_labels(labels_text)))
        else:
            name, _, value_text = line.partition(" ")
            labels = ()
        value = value_text.split()[0] if value_text.split() else "nan"
        out[(name.strip(), labels)] = float(value)
    return out


def _parse_labels(text: str) -> Iterator[tuple[str, str]]:
    i = 0
    while i < len(text):
        eq = text.index("=", i)
        key = text[i:eq].strip().lstrip(",").strip()
        j = eq + 2  # past ="
        value = []
        while text[j] != '"':
            if text[j] == "\\":
                j += 1
                value.append({"n": "\n"}.get(text[j], text[j]))
            else:
                value.append(text[j])
            j += 1
        yield key, "".join(value)
        i = j + 1
        while i < len(text) and text[i] in ", ":
            i += 1


def metric_sum(samples: Mapping[MetricKey, float], name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def padding_stats(batches: Iterable[Sequence[int]]) -> dict[str, float]:
    """Over a set of left-padded batches of prompt lengths: the share of all positions that
    are padding (position-weighted), and the mean per-batch ratio."""
    total = padded = 0
    per_batch = []
    for lengths in batches:
        if not lengths:
            continue
        width = max(lengths) * len(lengths)
        total += width
        padded += width - sum(lengths)
        per_batch.append(1 - sum(lengths) / width if width else 0.0)
    return {
        "padding_ratio": padded / total if total else 0.0,
        "mean_batch_padding_ratio": statistics.fmean(per_batch) if per_batch else 0.0,
    }


def fixed_batches(n: int, size: int) -> list[list[int]]:
    """Arrival order cut into batches of `size` (the static-batching baseline)."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def fmt_num(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def goal_row(
    number: str,
    name: str,
    goal: str,
    measured: str,
    met: bool | None,
    note: str = "",
) -> dict[str, Any]:
    return {"id": number, "benchmark": name, "goal": goal, "measured": measured, "met": met, "note": note}


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The README's benchmark table (markdown)."""
    out = ["| # | benchmark | goal | measured | met | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "–"}[r.get("met")]
        cells = [
            str(r.get(k, "")).replace("|", "\\|").replace("\n", " ")
            for k in ("id", "benchmark", "goal", "measured")
        ]
        note = str(r.get("note", "")).replace("|", "\\|").replace("\n", " ")
        out.append(f"| {' | '.join(cells)} | {met} | {note} |")
    return "\n".join(out)


def replace_between(text: str, start: str, end: str, body: str) -> str:
    """`text` with what lies between the markers `start` and `end` replaced by `body`."""
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if i < 0 or j < 0:
        raise ValueError(f"markers {start!r} … {end!r} not found")
    return text[: i + len(start)] + "\n" + body.strip("\n") + "\n" + text[j:]


# =========================================================================== machine, results


def machine() -> dict[str, Any]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    try:
        torch_version: str | None = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    load = os.getloadavg()
    return {
        "cpu_model": cpu_model(read("/proc/cpuinfo")),
        "cores": cores,
        "ram_bytes": mem_total_bytes(read("/proc/meminfo")),
        "torch": torch_version,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "git_commit": git_commit(ROOT / ".git"),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def write_result(name: str, payload: dict[str, Any], *, started: float, quick: bool) -> dict[str, Any]:
    """bench/results/<name>.json (quick runs: <name>.quick.json) with the machine's
    description; also printed."""
    doc = {
        "benchmark": name,
        "quick": quick,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "wall_s": round(time.monotonic() - started, 1),
        "machine": machine(),
        **payload,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / (f"{name}.quick.json" if quick else f"{name}.json")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    print(json.dumps(doc, indent=2, default=str))
    return doc


def arg_parser(description: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="a small smoke-test version")
    return ap


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Timer:
    """with Timer() as t: ...; t.s is the wall time in seconds (perf_counter)."""

    def __init__(self) -> None:
        self.s = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self._t0


# =========================================================================== the bench stack


def use_bench_stack() -> dict[str, str]:
    """Points this process (and the children it starts) at the bench stack and returns the
    client environment. Refuses the development and fault stacks."""
    if "EVALSTREAM_PORT_OFFSET" not in os.environ:
        # `make` exports EVALSTREAM_STACK=.stack for the dev stack: never inherit it here
        os.environ["EVALSTREAM_PORT_OFFSET"] = str(BENCH_OFFSET)
        os.environ["EVALSTREAM_STACK"] = str(ROOT / ".stack-bench")
    offset = int(os.environ["EVALSTREAM_PORT_OFFSET"])
    stack = Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack-bench")).resolve()
    if offset in FORBIDDEN_OFFSETS or stack in {
        (ROOT / ".stack").resolve(),
        (ROOT / ".stack-faults").resolve(),
    }:
        raise SystemExit(
            f"bench: refusing to run on the stack at offset {offset} ({stack}); benchmarks use their own "
            "(EVALSTREAM_PORT_OFFSET=4000 EVALSTREAM_STACK=.stack-bench)"
        )
    os.environ["EVALSTREAM_STACK"] = str(stack)
    env = client_env()
    os.environ.update(env)
    return env


def offset() -> int:
    return int(os.environ.get("EVALSTREAM_PORT_OFFSET", BENCH_OFFSET))


def stack_dir() -> Path:
    return Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack-bench"))


def client_env() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(STACK_PY), "env"], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    env = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        if key:
            env[key.strip()] = value.strip()
    return env


def stack(*args: str, env: Mapping[str, str] | None = None, quiet: bool = True) -> None:
    """ops/local/stack.py ARGS on the bench stack; `env` reaches the services it starts."""
    proc = subprocess.run(
        [str(PY), str(STACK_PY), *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=quiet,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"stack.py {' '.join(args)} failed:\n{(proc.stdout or '')[-3000:]}{(proc.stderr or '')[-3000:]}"
        )


def ensure_up(worker_env: Mapping[str, str] | None = None, workers: int = 1) -> None:
    """Brings the bench stack up. With `worker_env`, (re)starts the worker with it; without,
    a worker left with other settings by an earlier benchmark is restarted with the
    defaults."""
    want = dict(worker_env or {})
    if worker_env_now() != want:
        for i in range(workers):
            stack("stop", f"worker-{i}")
    stack("up", "--workers", str(workers), env=want)
    set_worker_env(want)


def _worker_marker() -> Path:
    return stack_dir() / "run" / "bench-worker-env.json"


def worker_env_now() -> dict[str, str]:
    """The settings a benchmark last started the worker with ({}: the defaults)."""
    marker = _worker_marker()
    return dict(json.loads(marker.read_text())) if marker.exists() else {}


def set_worker_env(env: Mapping[str, str]) -> None:
    _worker_marker().parent.mkdir(parents=True, exist_ok=True)
    _worker_marker().write_text(json.dumps(dict(env)))


def reset_stack() -> None:
    """Deletes the bench stack's data (Kafka topics, database, objects) and brings it up
    afresh with the default worker: the way out of a run that cannot finish."""
    stack("clean")
    stack("up")
    set_worker_env({})


def restart(names: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Stops the named services and brings the stack up again (resets their peak RSS).
    `env` applies to what is restarted; the worker keeps the settings ensure_up gave it."""
    for name in names:
        stack("stop", name)
    stack("up", env={**worker_env_now(), **(env or {})})


def service_port(name: str) -> int:
    base = name.split("-")[0]
    index = int(name.split("-")[1]) if name.startswith("worker-") else 0
    return SERVICE_PORTS[base] + index + offset()


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def metrics(name: str) -> dict[MetricKey, float]:
    """The Prometheus samples a service exposes right now."""
    return parse_prometheus(http_get(f"http://127.0.0.1:{service_port(name)}/metrics"))


def wait_http(url: str, timeout: float) -> float:
    """Seconds until `url` answers 2xx."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            http_get(url, timeout=1.0)
            return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


# =========================================================================== /proc accounting


def pid_of(name: str) -> int | None:
    """The pid of a stack process from its pid file (PostgreSQL: its postmaster.pid)."""
    path = (
        stack_dir() / "postgres" / "postmaster.pid"
        if name == "postgres"
        else stack_dir() / "run" / f"{name}.pid"
    )
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = parse_proc_stat((d / "stat").read_text())["ppid"]
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def tree(pid: int, kids: Mapping[int, list[int]] | None = None) -> list[int]:
    kids = kids if kids is not None else children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, *, include_tree: bool = True) -> float:
    """User + system CPU seconds of a process, its reaped children (cutime/cstime) and,
    with `include_tree`, its live descendants (PostgreSQL's backends)."""
    total = 0
    pids = tree(pid) if include_tree else [pid]
    for i, p in enumerate(pids):
        try:
            st = parse_proc_stat(Path(f"/proc/{p}/stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
        total += st["utime"] + st["stime"] + (st["cutime"] + st["cstime"] if i == 0 else 0)
    return total / CLK_TCK


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM: the most resident memory the process ever had (restart it to reset)."""
    try:
        kib = parse_status_kib(Path(f"/proc/{pid}/status").read_text(), "VmHWM")
    except OSError:
        return None
    return kib * 1024 if kib is not None else None


def rss_bytes(pid: int) -> int | None:
    try:
        kib = parse_status_kib(Path(f"/proc/{pid}/status").read_text(), "VmRSS")
    except OSError:
        return None
    return kib * 1024 if kib is not None else None


@dataclass
class CpuMeter:
    """CPU seconds each named stack process spent between start() and stop()."""

    names: Sequence[str]
    before: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self.before = {n: cpu_seconds(p) for n in self.names if (p := pid_of(n)) is not None}

    def stop(self) -> dict[str, float]:
        for n, b in self.before.items():
            p = pid_of(n)
            if p is not None:
                self.used[n] = round(cpu_seconds(p) - b, 3)
        return self.used


# =========================================================================== data sets


def arithmetic_rows(n: int, seed: int, prefix: str = "q") -> list[dict[str, Any]]:
    """`n` distinct short questions with one-line answers (distinct, so that no item of a
    run is served from the answer cache by another). A different seed gives different
    questions of the same shape and length."""
    import random

    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    # two-digit numbers while they leave room (3 ops × 90 × 8 questions), larger beyond
    hi = 99 if n <= 1000 else 10 ** (len(str(n)) + 1) - 1
    while len(rows) < n:
        a, b = rnd.randint(10, hi), rnd.randint(2, 9)
        op = ("+", "-", "*")[len(rows) % 3]
        question = f"What is {a} {op} {b}?"
        if question in seen:
            continue
        seen.add(question)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append(
            {"id": f"{prefix}{len(rows):05d}", "question": question, "answer": str(answer), "category": op}
        )
    return rows


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def data_dir() -> Path:
    d = stack_dir() / "bench-data"
    d.mkdir(parents=True, exist_ok=True)
    return d


# =========================================================================== pipeline runs


class Unfinished(TimeoutError):
    """A run that had not every result in PostgreSQL when its time was up."""

    def __init__(self, run_id: str, done: int, total: int, timeout: float) -> None:
        super().__init__(f"run {run_id}: {done}/{total} results after {timeout:.0f}s")
        self.run_id, self.done, self.total, self.timeout = run_id, done, total, timeout


@dataclass
class PipelineRun:
    run_id: str
    items: int
    submit_s: float  # validation + upload + publish (in-process evalctl submit)
    elapsed_s: float  # submit start -> every result in PostgreSQL
    failed: int
    cache_hits: int

    @property
    def items_per_s(self) -> float:
        return self.items / self.elapsed_s if self.elapsed_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "items": self.items,
            "submit_s": round(self.submit_s, 3),
            "elapsed_s": round(self.elapsed_s, 3),
            "items_per_s": round(self.items_per_s, 3),
            "failed": self.failed,
            "cache_hits": self.cache_hits,
        }


def submit(dataset: Path, *extra: str) -> str:
    """`evalctl submit DATASET EXTRA...` in this process (no interpreter start in the
    timing): validates, uploads and publishes exactly as the command does; returns the run id."""
    from evalstream.cli.main import build_parser
    from evalstream.cli.submit import cmd_submit
    from evalstream.common.settings import Settings

    args = build_parser().parse_args(["submit", str(dataset), *extra])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        asyncio.run(cmd_submit(args, Settings.from_env()))
    run_id = out.getvalue().strip().splitlines()[-1].strip()
    if not run_id.startswith("run-"):
        raise RuntimeError(f"evalctl submit printed {out.getvalue()!r} {err.getvalue()!r}")
    return run_id


async def wait_results(run_id: str, total: int, timeout: float, poll_s: float) -> tuple[float, int, int]:
    import asyncpg

    conn = await asyncpg.connect(os.environ["DATABASE_URL"])
    try:
        deadline = time.monotonic() + timeout
        while True:
            n = await conn.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id)
            if n >= total:
                seen = time.time()
                row = await conn.fetchrow(
                    "SELECT count(*) FILTER (WHERE error IS NOT NULL) AS failed,"
                    " count(*) FILTER (WHERE cache_hit) AS hits FROM item_results WHERE run_id = $1",
                    run_id,
                )
                assert row is not None
                return seen, int(row["failed"]), int(row["hits"])
            status = await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
            if status == "rejected":
                raise RuntimeError(f"run {run_id} was rejected")
            if time.monotonic() > deadline:
                raise Unfinished(run_id, int(n), total, timeout)
            await asyncio.sleep(poll_s)
    finally:
        await conn.close()


def run_pipeline(
    rows: Sequence[Mapping[str, Any]] | Path,
    *extra: str,
    total: int | None = None,
    name: str = "bench",
    timeout: float = 1800,
    poll_s: float = 0.05,
) -> PipelineRun:
    """Submits a data set (rows, or a JSONL file already written) and waits until every
    item has its row in PostgreSQL. The clock runs from the start of `submit` to the poll
    that saw the last row."""
    if isinstance(rows, Path):
        path = rows
        assert total is not None
    else:
        path = write_jsonl(data_dir() / f"{name}-{time.time_ns()}.jsonl", rows)
        total = len(rows)
    t0 = time.time()
    run_id = submit(path, "--name", name, *extra)
    submitted = time.time()
    done, failed, hits = asyncio.run(wait_results(run_id, total, timeout, poll_s))
    if not isinstance(rows, Path):
        path.unlink(missing_ok=True)
    return PipelineRun(run_id, total, submitted - t0, done - t0, failed, hits)


# =========================================================================== the engine in-process


def load_engine() -> Any:
    """The default model's HFEngine exactly as a worker loads it (same cached safetensors)."""
    from evalstream.common.settings import Settings
    from evalstream.worker.engines import load_engine as _load

    return _load(DEFAULT_MODEL, Settings.from_env())


@dataclass
class Prepared:
    requests: list[Any]  # GenRequest
    prompt_tokens: list[int]
    max_new: list[int]


def prepare(
    engine: Any,
    rows: Sequence[Mapping[str, Any]],
    max_tokens: int | Sequence[int],
    grader: str = "exact",
    prompt_template: str | None = None,
) -> Prepared:
    """GenRequests for `rows` rendered as a worker renders them for a job with `grader` and
    `prompt_template` (None: the grader's default; the model's chat template around it),
    and their prompt lengths in tokens."""
    from evalstream.common.messages import GenerationParams, Item, Shard
    from evalstream.worker.engines.base import GenRequest
    from evalstream.worker.grading import resolve_grader
    from evalstream.worker.prompting import build_messages

    items = [Item(id=str(r["id"]), question=r["question"], answer=str(r.get("answer"))) for r in rows]
    per_item = [max_tokens] * len(items) if isinstance(max_tokens, int) else list(max_tokens)
    shard = Shard(
        run_id="bench",
        shard_id="bench-0",
        shard_index=0,
        shard_count=1,
        model=DEFAULT_MODEL,
        grader=grader,
        generation=GenerationParams(max_tokens=per_item[0] if per_item else 1),
        items=items,
        prompt_template=prompt_template,
    )
    requests, lengths = [], []
    for item, mt in zip(items, per_item, strict=True):
        messages = build_messages(shard, item, resolve_grader(grader, item))
        lengths.append(engine.count_tokens(engine.render_prompt(messages)))
        requests.append(
            GenRequest(item_id=item.id, messages=messages, params=GenerationParams(max_tokens=mt))
        )
    return Prepared(requests, lengths, per_item)


@dataclass
class EngineRun:
    items: int
    seconds: float
    batches: list[list[int]]
    completion_tokens: int
    outputs: list[Any]

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0


def run_engine(engine: Any, prepared: Prepared, batches: Sequence[Sequence[int]]) -> EngineRun:
    """engine.generate over `batches` (indices into prepared.requests), timed."""
    outputs: list[Any] = [None] * len(prepared.requests)
    t0 = time.perf_counter()
    for batch in batches:
        outs = engine.generate([prepared.requests[i] for i in batch])
        for i, o in zip(batch, outs, strict=True):
            outputs[i] = o
    seconds = time.perf_counter() - t0
    tokens = sum(getattr(o, "completion_tokens", 0) for o in outputs)
    return EngineRun(len(prepared.requests), seconds, [list(b) for b in batches], tokens, outputs)


def default_plan(prepared: Prepared) -> list[list[int]]:
    """The worker's batching plan with the worker's settings (BATCH_TOKEN_BUDGET, BATCH_MAX_ITEMS)."""
    from evalstream.common.settings import Settings
    from evalstream.worker.batching import plan_batches

    s = Settings.from_env()
    return plan_batches(
        prepared.prompt_tokens,
        token_budget=s.batch_token_budget,
        max_items=s.batch_max_items,
        max_new_tokens=prepared.max_new,
    )


def engine_calls(name: str = "worker-0") -> dict[str, float]:
    """Counters that move when a worker calls its engine: batches (the batch-size histogram's
    count), tokens generated, and engine requests where that counter exists."""
    m = metrics(name)
    return {
        "batches": metric_sum(m, "evalstream_batch_size_count"),
        "tokens_out": metric_sum(m, "evalstream_tokens_total", direction="out"),
        "tokens_in": metric_sum(m, "evalstream_tokens_total", direction="in"),
        "engine_requests": metric_sum(m, "evalstream_engine_requests_total"),
        "engine_busy_s": metric_sum(m, "evalstream_engine_busy_seconds_total"),
    }


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


def clear_answer_cache() -> int:
    """Empties the bench stack's answer cache (a cold start for the next run); returns the
    number of answers removed."""

    async def go() -> int:
        import asyncpg

        conn = await asyncpg.connect(os.environ["DATABASE_URL"])
        try:
            status = await conn.execute("DELETE FROM answer_cache")
            return int(status.split()[-1])
        finally:
            await conn.close()

    return asyncio.run(go())


def responses(run_id: str) -> dict[str, str | None]:
    """item_id -> response of a run's results."""

    async def go() -> dict[str, str | None]:
        import asyncpg

        conn = await asyncpg.connect(os.environ["DATABASE_URL"])
        try:
            rows = await conn.fetch("SELECT item_id, response FROM item_results WHERE run_id = $1", run_id)
            return {r["item_id"]: r["response"] for r in rows}
        finally:
            await conn.close()

    return asyncio.run(go())


def same_answers(prepared: Prepared, outputs: Sequence[Any], stored: Mapping[str, str | None]) -> float:
    """Share of items whose in-process answer equals the pipeline's stored response."""
    same = sum(
        1
        for req, out in zip(prepared.requests, outputs, strict=True)
        if getattr(out, "text", None) is not None and stored.get(req.item_id) == out.text
    )
    return same / len(prepared.requests) if prepared.requests else 0.0


# =========================================================================== services under a profiler


def service_env(name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ops/local/stack.py gives a service."""
    env = {**os.environ, "HTTP_PORT": str(service_port(name)), "PYTHONUNBUFFERED": "1", **client_env()}
    if name.startswith("worker-"):
        env["WORKER_ID"] = name
    env.update(extra or {})
    return env


def spawn(name: str, argv: Sequence[str], extra_env: Mapping[str, str] | None = None) -> int:
    """Starts a stack service as stack.py would (its environment, pid file and log), without
    waiting for it; returns its pid. Stop it with `stack("stop", name)`."""
    run_dir, log_dir = stack_dir() / "run", stack_dir() / "logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{name}.log").open("ab") as out:
        p = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=service_env(name, extra_env),
            start_new_session=True,
            cwd=ROOT,
        )
    (run_dir / f"{name}.pid").write_text(str(p.pid))
    return p.pid


def start_sampled(name: str, out_prefix: Path, extra_env: Mapping[str, str] | None = None) -> None:
    """(Re)starts a stack service under bench/sampler.py (CPU-weighted stack samples of
    every thread), with the pid file and log where stack.py keeps them."""
    stack("stop", name)
    module = f"evalstream.{name.split('-')[0]}"
    spawn(name, [str(PY), str(BENCH / "sampler.py"), "--out", str(out_prefix), "-m", module], extra_env)
    wait_http(f"http://127.0.0.1:{service_port(name)}/healthz", 180)


def boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime"):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def process_start_epoch(pid: int) -> float:
    """When a process started (Unix time), from /proc/<pid>/stat's starttime."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return boot_time() + int(rest[19]) / CLK_TCK


def wait_pipeline_ready(timeout: float = 120) -> float:
    """Seconds until the worker is ready and the router counts it live."""
    t0 = time.monotonic()
    wait_http(f"http://127.0.0.1:{service_port('worker-0')}/readyz", timeout)
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(OSError, urllib.error.URLError):
            if (
                metric_sum(metrics("router"), "evalstream_router_group_live_members", worker_group="default")
                >= 1
            ):
                return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError("the router never saw a live worker")


class Budget:
    """Wall-time allowance of a benchmark's repeats, so that `make bench` stays within its
    30 minutes on a machine shared with other work: once spent, no further repeat starts
    (after the minimum). BENCH_TIME_SCALE multiplies every allowance."""

    def __init__(self, seconds: float, min_repeats: int) -> None:
        self.seconds = seconds * float(os.environ.get("BENCH_TIME_SCALE", "1"))
        self.min_repeats = min_repeats
        self.t0 = time.monotonic()
        self.stopped_early = False

    def another(self, done: int, wanted: int) -> bool:
        """Whether repeat number `done` (0-based) should run."""
        if done >= wanted:
            return False
        if done >= self.min_repeats and time.monotonic() - self.t0 > self.seconds:
            log(f"time allowance of {self.seconds:.0f} s spent: stopping after {done} repeats")
            self.stopped_early = True
            return False
        return True

    def range(self, wanted: int) -> Iterator[int]:
        """0, 1, … up to `wanted` repeats, fewer once the allowance is spent."""
        done = 0
        while self.another(done, wanted):
            yield done
            done += 1
        self.done = done

    def as_dict(self) -> dict[str, Any]:
        return {
            "allowance_s": self.seconds,
            "repeats_done": getattr(self, "done", None),
            "stopped_early": self.stopped_early,
        }


# =========================================================================== interference


STACK_PROCESSES = ("kafka", "postgres", "s3", "prometheus", "producer", "router", "aggregator", "worker-0")


def parse_cpu_busy_ticks(stat: str) -> int:
    """Busy ticks of all CPUs from /proc/stat's first line (everything but idle and iowait)."""
    fields = stat.splitlines()[0].split()
    assert fields[0] == "cpu"
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return user + nice + system + irq + softirq + steal


def own_cpu_s() -> float:
    """CPU seconds of the bench stack's processes and of this process with its children."""
    total = cpu_seconds(os.getpid())
    for name in STACK_PROCESSES:
        pid = pid_of(name)
        if pid is not None:
            total += cpu_seconds(pid)
    return total


class Interference:
    """How many cores other work on the machine kept busy while a measurement ran: all CPU
    time (/proc/stat) less this benchmark's own (its stack and this process tree)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.machine0 = parse_cpu_busy_ticks(Path("/proc/stat").read_text()) / CLK_TCK
        self.own0 = own_cpu_s()

    def cores(self) -> float:
        elapsed = time.monotonic() - self.t0
        machine = parse_cpu_busy_ticks(Path("/proc/stat").read_text()) / CLK_TCK - self.machine0
        own = own_cpu_s() - self.own0
        return round(max(0.0, machine - own) / elapsed, 3) if elapsed > 0 else 0.0


def quiet_pairs(foreign: Sequence[tuple[float, float]], tolerance: float = 0.25) -> list[int]:
    """Indices of the repeats whose two arms ran under about the same outside load (other
    work on the machine, in cores, differing by at most `tolerance`): their ratio compares
    like with like."""
    return [i for i, (a, b) in enumerate(foreign) if abs(a - b) <= tolerance]


def headline(values: Sequence[float], foreign: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """The median of the repeats whose arms saw the same outside load when there are at
    least two of them, else of all repeats (flagged)."""
    quiet = quiet_pairs(foreign)
    chosen = [values[i] for i in quiet] if len(quiet) >= 2 else list(values)
    return {
        **summarize(chosen),
        "of_repeats": quiet if len(quiet) >= 2 else list(range(len(values))),
        "all_repeats": summarize(values),
        "noisy": len(quiet) < 2,
    }


def headline_text(h: Mapping[str, Any], unit: str = "") -> str:
    """`1.02× (median of 3 repeats under equal outside load, 0.98–1.10; all 5: 1.05×)`."""
    n_all = h["all_repeats"]["n"]
    which = (
        f"median of {h['n']}, outside load too uneven to pick"
        if h["noisy"]
        else f"median of {h['n']} of {n_all} repeats under equal outside load"
    )
    text = f"{fmt_num(h['median'])}{unit} ({which}; {fmt_num(h['min'])}–{fmt_num(h['max'])}"
    if not h["noisy"] and h["n"] != n_all:
        text += f"; all {n_all}: {fmt_num(h['all_repeats']['median'])}{unit}"
    return text + ")"
