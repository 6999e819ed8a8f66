"""Runs every benchmark on the bench stack, then writes bench/results/summary.json and the
table in README.md (between <!-- bench:start --> and <!-- bench:end -->).

    .venv/bin/python bench/run_all.py [--quick] [--only NAME ...] [--table]

Each benchmark is its own process (bench/<name>.py), so one failing does not stop the
others; its JSON is read back from bench/results/. --quick runs the smoke-test sizes and
writes summary.quick.json without touching the README. --only updates those entries of the
last summary and leaves the README to full runs; --table runs nothing and rewrites the README
table from each benchmark's latest results file, with when and at which commit each ran.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import benchstack, paths, pure, recording

BENCHMARKS = [
    "engine_efficiency",
    "against_lmeval",
    "against_lmeval_mc",
    "pipeline_ceiling",
    "delta_log",
    "spread_scaling",
    "cache",
    "worker_start",
    "batching",
    "label_audit",
    "report_items",
    "api_limit",
]
BUDGET_S = 30 * 60
README = paths.ROOT / "README.md"


def readme_body(summary: dict[str, Any]) -> str:
    m = summary["machine"]
    rows = [g for b in summary["benchmarks"].values() for g in b.get("goals", [])]
    failed = [f"`{n}` ({b['error']})" for n, b in summary["benchmarks"].items() if b.get("error")]
    lines = [
        f"Measured {summary['finished_at']} by `make bench` in {summary['total_s'] / 60:.1f} min on "
        f"{m['cpu_model']}, {m['cores']} cores, {round((m['ram_bytes'] or 0) / 2**30)} GiB RAM, no GPU; "
        f"torch {m['torch']}, transformers {m['transformers']}; commit `{(m['git_commit'] or '?')[:12]}`. "
        "The machine is shared: ratios are of two things measured side by side, median of repeats; "
        "raw numbers in `bench/results/*.json`.",
        "",
        pure.render_table(rows),
    ]
    if failed:
        lines += ["", "Did not finish: " + ", ".join(failed)]
    notes = [(n, d) for n, b in summary["benchmarks"].items() for d in b.get("diagnosis", [])]
    if notes:
        lines += ["", "Where a goal is missed — where the time goes and what would close it:", ""]
        lines += [f"* **{n}**: {d}" for n, d in notes]
    return "\n".join(lines)


def assembled_body() -> str:
    """The README table from each benchmark's latest full run (bench/results/<name>.json),
    saying when and at which commit each one ran: for benchmarks re-run one at a time."""
    rows, notes, when = [], [], []
    for name in BENCHMARKS:
        path = paths.RESULTS / f"{name}.json"
        if not path.exists():
            when.append(f"`{name}` never run")
            continue
        doc = json.loads(path.read_text())
        machine = doc.get("machine", {})
        load = machine.get("loadavg_at_start") or ["?"]
        when.append(
            f"`{name}` {str(doc.get('finished_at', '?'))[:16].replace('T', ' ')} "
            f"(commit `{(machine.get('git_commit') or '?')[:12]}`, load {load[0]})"
        )
        rows += doc.get("goals", [])
        notes += [(name, d) for d in doc.get("diagnosis", [])]
    lines = [
        "Assembled by `bench/run_all.py --table` from each benchmark's latest full run, on 2 cores, "
        "no GPU; the machine is shared: ratios are of two things measured side by side, median of "
        "repeats; raw numbers in `bench/results/*.json`. When each ran: " + "; ".join(when) + ".",
        "",
        pure.render_table(rows),
    ]
    if notes:
        lines += ["", "Where a goal is missed — where the time goes and what would close it:", ""]
        lines += [f"* **{n}**: {d}" for n, d in notes]
    return "\n".join(lines)


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run these only")
    ap.add_argument(
        "--table",
        action="store_true",
        help="run nothing: rewrite the README table from each benchmark's latest results file",
    )
    args = ap.parse_args()
    if args.table:
        README.write_text(
            pure.replace_between(README.read_text(), paths.README_START, paths.README_END, assembled_body())
        )
        recording.log("README.md benchmark table assembled from bench/results/*.json")
        return
    started = time.monotonic()
    benchstack.use_bench_stack()
    recording.log(
        f"bringing the bench stack up ({benchstack.stack_dir()}, port offset {benchstack.offset()})"
    )
    benchstack.ensure_up()
    names = args.only or BENCHMARKS
    results: dict[str, Any] = {}
    for name in names:
        t0 = time.monotonic()
        recording.log(f"=== {name}")
        cmd = [sys.executable, str(paths.BENCH / f"{name}.py"), *(["--quick"] if args.quick else [])]
        proc = subprocess.run(cmd, cwd=paths.ROOT, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        path = paths.RESULTS / (f"{name}.quick.json" if args.quick else f"{name}.json")
        entry: dict[str, Any] = {"rc": proc.returncode, "wall_s": round(wall, 1)}
        if proc.returncode == 0 and path.exists():
            doc = json.loads(path.read_text())
            entry["goals"] = doc.get("goals", [])
            entry["diagnosis"] = doc.get("diagnosis", [])
        else:
            entry["error"] = f"exit code {proc.returncode}"
        results[name] = entry
        recording.log(
            f"=== {name}: {wall:.0f} s, rc {proc.returncode}; {time.monotonic() - started:.0f} s so far"
        )
    total = time.monotonic() - started
    summary = {
        "finished_at": time.strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "total_s": round(total, 1),
        "budget_s": BUDGET_S,
        "within_budget": total <= BUDGET_S,
        "machine": recording.machine(),
        "benchmarks": results,
    }
    out = paths.RESULTS / ("summary.quick.json" if args.quick else "summary.json")
    if args.only and out.exists():
        # One benchmark re-run: its entry replaces the last full run's, the rest stays
        # (the README table is rewritten by full runs only).
        previous = json.loads(out.read_text())
        summary = {
            **previous,
            "benchmarks": {**previous.get("benchmarks", {}), **results},
            "rerun_since": {
                **previous.get("rerun_since", {}),
                **dict.fromkeys(results, summary["finished_at"]),
            },
        }
    out.write_text(json.dumps(summary, indent=2) + "\n")
    rows = [g for b in results.values() for g in b.get("goals", [])]  # this invocation's
    print(pure.render_table(rows))
    print(json.dumps({k: v for k, v in summary.items() if k != "benchmarks"}, indent=2))
    if not args.quick and not args.only:
        text = README.read_text()
        README.write_text(
            pure.replace_between(text, paths.README_START, paths.README_END, readme_body(summary))
        )
        recording.log("README.md benchmark table updated")
    if total > BUDGET_S:
        recording.log(
            f"warning: the benchmarks took {total / 60:.1f} min, over the {BUDGET_S / 60:.0f} min budget"
        )
    if any(r.get("error") for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
