"""Pure helpers of the benchmarks (parsing /proc and Prometheus text, statistics, the README
table), unit-tested in tests/unit/test_bench_helpers.py."""

from __future__ import annotations

import contextlib
import platform
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


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


def med(values: Sequence[float]) -> float | None:
    """The median, rounded for reading (None of nothing)."""
    return round(statistics.median(values), 4) if values else None


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
