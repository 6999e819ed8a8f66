"""10. Against lm-evaluation-harness on multiple choice, the same task YAML: BIG-bench's
date_understanding (369 questions, 6 choices each, from the `bigbench` package; not tuned on)
as lm-eval's own bigbench YAML asks it (bench/lmeval_mc: its template copy without the
Python `process_docs`, which drops nothing here), run by lm-eval 0.4.13 (`lm_eval run --model
hf`, fp32, its best batch size of a sweep, its samples logged) and by `evalctl submit --task
... --wait` on the running bench stack (the worker's `loglikelihood` grader), on the `hf:` and
`ov:` engines.

* **Same answers.** The chosen choice (highest log-likelihood) per document, lm-eval's against
  each engine's: identical for ≥ 99 % of documents; acc and acc_norm (lm-eval's formulas: the
  argmax of the log-likelihoods, and of the log-likelihoods per character of the choice)
  within 0.5 points of lm-eval's.
* **Whole process.** lm-eval's CLI from start to exit (its best batch size) against `evalctl
  submit --task --wait` from start to exit (reading the YAML, rendering, validating, uploading,
  the whole run, its report), the answer cache emptied first: goal ≥ 2× faster.

Both tools read the hub name `hails/bigbench` from bench/lmeval_mc/data: evalctl with
`--data-dir`, lm-eval through bench/lmeval_mc/run_lmeval.py (its CLI with `datasets.load_dataset`
mapped to the same files). Per-document log-likelihoods: lm-eval's from its samples file, the
pipeline's from each result's response (the engine's scores); acc and acc_norm are computed
from them the same way for both, and the pipeline's own `correct` / `correct_norm` are checked
against that.

Needs the worker's log-likelihood scoring (grader `loglikelihood`); exits 2 without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import arms, benchstack, inprocess, interference, lmeval, paths, pure, recording
from bench.harness.venvs import LMEVAL_VERSION, VENV, ensure_lmeval_venv

NAME = "against_lmeval_mc"
HERE = paths.BENCH / "lmeval_mc"
TASK_DIR = HERE / "tasks"
DATA_DIR = HERE / "data"
TASK_YAML = TASK_DIR / "bigbench" / "multiple_choice" / "date_understanding.yaml"
TASK = "bigbench_date_understanding_multiple_choice"
SPECS = ("hf:smollm2-135m-instruct", "ov:smollm2-135m-instruct")
SAME_CHOICE_GOAL = 0.99
METRIC_POINTS_GOAL = 0.5
SPEED_GOAL = 2.0


def argmax(values: list[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def scored(lls: list[float], choices: list[str], gold: int) -> dict[str, Any]:
    """lm-eval's multiple_choice process_results for one document."""
    pred = argmax(lls)
    pred_norm = argmax([ll / len(c) for ll, c in zip(lls, choices, strict=True)])
    return {"pred": pred, "pred_norm": pred_norm, "acc": pred == gold, "acc_norm": pred_norm == gold}


def task_items(limit: int | None) -> dict[str, Any]:
    from evalstream.common.lmeval import read_tasks

    [task] = read_tasks(TASK_YAML, root=TASK_DIR, data_dir=DATA_DIR, limit=limit)
    return {item.id: item for item in task.items}


def summarise(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    n = len(docs)
    return {
        "docs": n,
        "acc": round(sum(d["acc"] for d in docs.values()) / n, 6) if n else None,
        "acc_norm": round(sum(d["acc_norm"] for d in docs.values()) / n, 6) if n else None,
    }


# ----------------------------------------------------------------------------- lm-eval


def lmeval_cli(model_dir: Path, batch_size: int, limit: int | None, items: dict[str, Any]) -> dict[str, Any]:
    """`lm_eval run --model hf` as a user runs it (through run_lmeval.py: hub names read
    locally), from start to exit; per-document log-likelihoods from its samples file."""
    out_dir = Path(tempfile.mkdtemp(prefix="lmeval-mc-", dir=benchstack.stack_dir()))
    argv = [
        str(VENV / "bin" / "python"),
        str(HERE / "run_lmeval.py"),
        str(DATA_DIR),
        "run",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={model_dir},dtype=float32",
        "--device",
        "cpu",
        "--tasks",
        TASK,
        "--include_path",
        str(TASK_DIR),
        "--batch_size",
        str(batch_size),
        "--output_path",
        str(out_dir),
        "--log_samples",
        "--seed",
        "0",
        *(["--limit", str(limit)] if limit else []),
    ]
    samples, timing = lmeval.run_cli(
        argv, cwd=TASK_DIR, log_name="bench-lmeval-mc.log", out_dir=out_dir, task=TASK
    )
    docs: dict[str, dict[str, Any]] = {}
    for s in samples:
        item = items[str(s["doc_id"])]
        lls = [float(r[0]) for r in s["filtered_resps"]]
        gold = int(s["target"])
        assert gold == int(item.answer), (
            f"doc {s['doc_id']}: lm-eval's gold {gold}, the reader's {item.answer}"
        )
        docs[str(s["doc_id"])] = {"lls": lls, **scored(lls, item.choices, gold)}
    seconds = timing["seconds"]
    return {
        "batch_size": batch_size,
        "seconds": round(seconds, 3),
        "loadavg_1m": round(timing["loadavg_1m"], 2),
        "other_load_cores": timing["other_load_cores"],
        **summarise(docs),
        "docs_detail": docs,
    }


# ----------------------------------------------------------------------------- the pipeline


def stored_results(run_id: str) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        import asyncpg

        conn = await asyncpg.connect(os.environ["DATABASE_URL"])
        try:
            rows = await conn.fetch(
                "SELECT item_id, response, correct, correct_norm, error FROM item_results WHERE run_id = $1",
                run_id,
            )
            return [dict(r) for r in rows]
        finally:
            await conn.close()

    return asyncio.run(go())


def evalctl_task(spec: str, limit: int | None, items: dict[str, Any]) -> dict[str, Any]:
    """`evalctl submit --task ... --wait` from start to exit, the answer cache emptied first."""
    inprocess.clear_answer_cache()
    other = interference.Interference()
    load = os.getloadavg()[0]
    seconds, summary = arms.timed_submit(
        "--task", str(TASK_YAML), "--task-root", str(TASK_DIR), "--data-dir", str(DATA_DIR), "--model", spec,
        *(["--limit", str(limit)] if limit else []),
    )  # fmt: skip
    docs: dict[str, dict[str, Any]] = {}
    graded_as_formula = 0
    failed = 0
    for r in stored_results(summary["run_id"]):
        if r["error"] is not None:
            failed += 1
            continue
        item = items[r["item_id"]]
        lls = [float(x) for x in json.loads(r["response"])["loglikelihoods"]]
        d = scored(lls, item.choices, int(item.answer))
        graded_as_formula += int(r["correct"] == d["acc"] and r["correct_norm"] == d["acc_norm"])
        docs[r["item_id"]] = {"lls": lls, **d}
    return {
        "spec": spec,
        "run_id": summary["run_id"],
        "seconds": round(seconds, 3),
        "failed": failed,
        "grader_agrees_with_formula": graded_as_formula,
        "reported_accuracy": summary.get("accuracy"),
        "loadavg_1m": round(load, 2),
        "other_load_cores": other.cores(),
        **summarise(docs),
        "docs_detail": docs,
    }


def compare(ref: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    a, b = ref["docs_detail"], run["docs_detail"]
    common = sorted(a.keys() & b.keys(), key=int)
    same = sum(a[k]["pred"] == b[k]["pred"] for k in common)
    same_norm = sum(a[k]["pred_norm"] == b[k]["pred_norm"] for k in common)
    max_ll_diff = max(
        (max(abs(x - y) for x, y in zip(a[k]["lls"], b[k]["lls"], strict=True)) for k in common), default=None
    )
    return {
        "docs": len(common),
        "missing": len(a) - len(common),
        "same_choice": round(same / len(common), 4) if common else 0.0,
        "same_choice_norm": round(same_norm / len(common), 4) if common else 0.0,
        "acc_points": round(100 * abs(ref["acc"] - run["acc"]), 3) if run["acc"] is not None else None,
        "acc_norm_points": round(100 * abs(ref["acc_norm"] - run["acc_norm"]), 3)
        if run["acc_norm"] is not None
        else None,
        "max_loglikelihood_diff": round(max_ll_diff, 6) if max_ll_diff is not None else None,
        "differing_docs": [k for k in common if a[k]["pred"] != b[k]["pred"]][:20],
    }


def scoring_available() -> str | None:
    """Why the pipeline cannot score log-likelihoods yet, or None."""
    from evalstream.common.graders import GRADERS

    if "loglikelihood" not in GRADERS:
        return "the grader registry has no `loglikelihood` grader"
    try:
        from evalstream.worker.grading import get_grader  # noqa: F401
    except (ImportError, AssertionError) as exc:
        return f"the worker's graders do not load ({type(exc).__name__}: {exc})"
    return None


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=2, help="repeats of every arm (medians reported)")
    ap.add_argument("--sweep", default="8,32,64", help="lm-eval batch sizes to sweep (comma-separated)")
    ap.add_argument("--limit", type=int, help="the first N documents only (default: all 369)")
    ap.add_argument(
        "--sweep-limit",
        type=int,
        help="documents of the batch-size sweep (default: those of the comparison); the best batch "
        "size then runs the comparison",
    )
    args = ap.parse_args()
    if why := scoring_available():
        recording.log(f"not run: {why} (the worker's log-likelihood scoring has not landed)")
        raise SystemExit(2)
    started = time.monotonic()
    limit = args.limit if not args.quick else 30
    sweep = [int(b) for b in args.sweep.split(",")] if not args.quick else [16]
    repeats = args.repeats if not args.quick else 1
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    venv = ensure_lmeval_venv()
    model_dir = lmeval.bundled_model_files()
    items = task_items(limit)
    recording.log(f"{len(items)} documents; lm-eval venv {venv['path']}; model files {model_dir}")

    for spec in SPECS:  # the worker loads each engine once before anything is timed
        warm = evalctl_task(spec, 2, items)
        recording.log(f"worker warm for {spec}: {warm['seconds']} s")

    sweep_limit = args.sweep_limit if args.sweep_limit and not args.quick else limit
    sweep_items = task_items(sweep_limit) if sweep_limit != limit else items
    sweep_runs = []
    for b in sweep:
        run = lmeval_cli(model_dir, b, sweep_limit, sweep_items)
        recording.log(f"lm-eval batch {b}: {run['seconds']} s, acc {run['acc']}")
        sweep_runs.append(run)
    best = min(sweep_runs, key=lambda r: r["seconds"])["batch_size"]

    reps: list[dict[str, Any]] = []
    arms = ["lmeval", *SPECS]
    for r in range(repeats):
        rep: dict[str, Any] = {}
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:  # rotating order
            rep[arm] = (
                lmeval_cli(model_dir, best, limit, items)
                if arm == "lmeval"
                else evalctl_task(arm, limit, items)
            )
            recording.log(
                f"repeat {r} {arm}: {rep[arm]['seconds']} s, acc {rep[arm]['acc']}, acc_norm {rep[arm]['acc_norm']}"
            )
        rep["compare"] = {spec: compare(rep["lmeval"], rep[spec]) for spec in SPECS}
        rep["speedup"] = {spec: round(rep["lmeval"]["seconds"] / rep[spec]["seconds"], 4) for spec in SPECS}
        recording.log(f"repeat {r}: {rep['compare']}, speed-up {rep['speedup']}")
        for arm in arms:
            rep[arm] = {k: v for k, v in rep[arm].items() if k != "docs_detail"}
        reps.append(rep)

    same = {s: min(x["compare"][s]["same_choice"] for x in reps) for s in SPECS}
    points = {
        s: max(max(x["compare"][s]["acc_points"] or 0, x["compare"][s]["acc_norm_points"] or 0) for x in reps)
        for s in SPECS
    }
    speed = {s: pure.med([x["speedup"][s] for x in reps]) for s in SPECS}
    loads = [x[a]["loadavg_1m"] for x in reps for a in arms]
    note = (
        f"{len(items)} documents of BIG-bench date_understanding (lm-eval's bigbench YAML), lm-eval "
        f"{LMEVAL_VERSION} hf fp32 at its best batch of {sweep} ({best}, swept on {len(sweep_items)} documents); worst of {len(reps)} repeats for "
        f"answers, median for time; load average {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores"
    )
    goals = [
        pure.goal_row(
            f"10{'ab'[i]}",
            f"vs lm-eval multiple choice, same YAML ({spec.split(':')[0]}): chosen choice identical; acc, acc_norm",
            f"≥ {SAME_CHOICE_GOAL:.0%}; within {METRIC_POINTS_GOAL} points",
            f"{same[spec]:.1%}; {points[spec]:.2f} points",
            same[spec] >= SAME_CHOICE_GOAL and points[spec] <= METRIC_POINTS_GOAL,
            note,
        )
        for i, spec in enumerate(SPECS)
    ] + [
        pure.goal_row(
            f"10{'cd'[i]}",
            f"vs lm-eval multiple choice, whole process ({spec.split(':')[0]}; lm_eval CLI ÷ evalctl submit --task --wait)",
            f"≥ {SPEED_GOAL:g}×",
            f"{pure.fmt_num(speed[spec])}×",
            (speed[spec] or 0) >= SPEED_GOAL,
            note,
        )
        for i, spec in enumerate(SPECS)
    ]
    recording.write_result(
        NAME,
        {
            "params": {
                "task_yaml": str(TASK_YAML.relative_to(paths.ROOT)),
                "documents": len(items),
                "sweep": sweep,
                "sweep_documents": len(sweep_items),
                "repeats": repeats,
                "model_dir": str(model_dir),
                "lmeval_version": LMEVAL_VERSION,
                "engines": list(SPECS),
            },
            "lmeval_venv": venv,
            "lmeval_sweep": [{k: v for k, v in x.items() if k != "docs_detail"} for x in sweep_runs],
            "best_batch_size": best,
            "repeats": reps,
            "medians": {
                "lmeval_s": pure.med([x["lmeval"]["seconds"] for x in reps]),
                **{f"{s.split(':')[0]}_s": pure.med([x[s]["seconds"] for x in reps]) for s in SPECS},
                **{f"speedup_{s.split(':')[0]}": speed[s] for s in SPECS},
            },
            "goals": goals,
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
