"""2. Against lm-evaluation-harness, the whole story: the same 128 questions, model weights,
prompts and greedy settings, each tool at its best settings, timed as a user would.

* **Whole process.** lm-eval's CLI (`lm_eval --model hf ... --batch_size B`) from start to
  exit, swept over batch sizes (its best is the reference), against `evalctl submit --wait`
  from start to exit on a running stack whose worker has its model loaded (the answer cache
  emptied first), for the `ov:` engine (OpenVINO GenAI continuous batching, fp32) and the
  `hf:` engine (transformers), each with the worker's batch limits for its engine and device
  (settings.BATCH_LIMITS, measured by bench/batch_sweep.py).
* **Generation only.** lm-eval's `generate_until` with its model loaded once
  (bench/lmeval/driver.py) at its best batch size, against the pipeline's engine called
  directly in this process with the worker's batching plan (`direct`), and against the time
  the worker spent inside the engine during the pipeline run (`engine_busy_s`).
* **Pipeline ÷ the same engine called directly** (submit → last result in PostgreSQL, in
  process, vs `direct`): what the pipeline around the engine costs.
* **Answers.** `evalctl compare` (identical answers, accuracy delta, McNemar's exact test)
  between the ov fp32 and hf fp32 runs, and between each and lm-eval's answers.

lm-eval runs in bench/.venv-lmeval (created on first use: a venv whose `.pth` appends the
project's site-packages, so it shares the project's torch and transformers; install time and
size recorded). Its task (bench/lmeval/evalstream_short_qa.yaml) renders the pipeline's
prompt (the "exact" grader's template inside the model's chat template; the first prompt is
compared). Its `openvino` backend (OptimumLM: transformers' generate() on static, padded
batches with an OpenVINO model) needs optimum-intel, which requires transformers < 5.6 while
the project pins 5.24: it runs from a venv of its own, bench/.venv-lmeval-ov (its own
transformers, the project's torch and openvino), on an IR that `optimum-cli export openvino
--weight-format fp32` made once from the same safetensors (not timed, as a user exports once),
with the same fp32 OpenVINO settings as the pipeline's `ov:` engine. It is swept and repeated
like the HF backend; lm-eval's reference in every ratio is its faster backend among those
whose answers match its HF backend's on ≥ 95 % of items (faithful, as asked of the pipeline).

OpenVINO keeps the KV cache of whole prompts it has seen (prefix caching), so no ov engine is
timed on questions it has already answered: each repeat's pipeline runs ask a fresh set of
the same generator, shape and length (the ov and hf runs the same set, paired by `evalctl
compare`), and the direct engine is loaded afresh before it answers lm-eval's questions.
Repeats run the arms in rotating order; medians of the repeats are reported with the load
average and the cores other programs kept busy during each arm (bench/harness/interference.py).
Goals (issue 17): whole process ≥ 2×, generation only ≥ 1.5×, ≥ 95 % answers identical to
the hf fp32 engine with an accuracy difference that is not significant (McNemar p ≥ 0.05),
pipeline ÷ direct engine ≥ 0.95.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    arms,
    benchstack,
    data,
    inprocess,
    lmeval,
    pipeline_runs,
    profiled,
    pure,
    recording,
)
from bench.harness.lmeval import TASK_DIR
from bench.harness.venvs import VENV, ensure_lmeval_venv

NAME = "against_lmeval"
FAITHFUL_SHARE = 0.95
DATA = TASK_DIR / "short_qa.jsonl"


# ----------------------------------------------------------------------------- main

OV_SPEC, HF_SPEC = "ov:smollm2-135m-instruct", "hf:smollm2-135m-instruct"
# arm names per backend: the CLI from start to exit, and generate_until in the driver
CLI_ARM = {"hf": "lmeval_cli", "openvino": "lmeval_cli_ov"}
GEN_ARM = {"hf": "lmeval_generate", "openvino": "lmeval_generate_ov"}


@dataclass
class Sizes:
    n: int
    max_tokens: int
    sweep: list[int]
    repeats: int
    limit: int | None


@dataclass
class Setup:
    """lm-eval's venvs and backends and the model files they load."""

    venv: dict[str, Any]
    settings: Any  # evalstream.common.settings.Settings
    model_dir: Path
    backends: list[lmeval.Backend]
    ov_backend: dict[str, Any]


def parse_sizes() -> tuple[Any, Sizes]:
    ap = recording.arg_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of every arm (medians reported)")
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens at most (lm-eval's max_gen_toks)")
    ap.add_argument(
        "--questions", type=int, default=128, help="questions per run (fewer on a loaded machine)"
    )
    ap.add_argument("--sweep", default="8,32,128", help="lm-eval batch sizes to sweep (comma-separated)")
    args = ap.parse_args()
    n, max_tokens = (args.questions, args.max_tokens) if not args.quick else (16, 8)
    sweep = [int(b) for b in args.sweep.split(",")] if not args.quick else [4, 16]
    repeats, limit = (args.repeats, None) if not args.quick else (1, None)
    return args, Sizes(n, max_tokens, sweep, repeats, limit)


def set_up_lmeval() -> Setup:
    """lm-eval's venv, the safetensors the worker's hf engine reads, and lm-eval's backends."""
    venv = ensure_lmeval_venv()
    from evalstream.common.settings import Settings

    settings = Settings.from_env()
    model_dir = lmeval.bundled_model_files()
    recording.log(f"lm-eval venv {venv}; model files {model_dir}")
    backends, ov_backend = lmeval.backends(model_dir, VENV)
    return Setup(venv, settings, model_dir, backends, ov_backend)


def warm_worker(rows: list[dict[str, Any]]) -> None:
    """The worker loads both engines once (the ov IR is converted on first use) before timing."""
    for spec in (OV_SPEC, HF_SPEC):
        warm = pipeline_runs.run_pipeline(
            rows[:2], "--model", spec, "--max-tokens", "4", name="bench-lmeval-warm"
        )
        recording.log(f"worker warm for {spec}: {warm.elapsed_s:.1f} s")


def run_arm(
    arm: str,
    r: int,
    rows: list[dict[str, Any]],
    size: Sizes,
    drivers: dict[str, lmeval.LmEval],
    sweep: lmeval.Sweep,
    by_arm: dict[str, tuple[str, lmeval.Backend]],
) -> tuple[dict[str, Any], str | None]:
    """One arm of repeat `r`; with the direct engine's revision where it ran."""
    # OpenVINO's prefix cache keeps whole prompts it has seen: every pipeline run asks
    # questions its worker has not seen (same generator, shape and length as lm-eval's
    # set); the ov and hf runs share theirs, so that evalctl compare pairs them
    n, max_tokens = size.n, size.max_tokens
    if arm in by_arm:
        kind, b = by_arm[arm]
        if kind == "cli":
            return lmeval.lmeval_cli(b, sweep.best_cli[b.name], max_tokens, size.limit), None
        return drivers[b.name].evaluate(sweep.best_gen[b.name], size.limit), None
    if arm in ("pipeline_ov", "pipeline_hf"):
        fresh = data.arithmetic_rows(n, seed=1000 + r, prefix=f"p{r}-")
        spec, short = (OV_SPEC, "ov") if arm == "pipeline_ov" else (HF_SPEC, "hf")
        return arms.evalctl_submit_wait(fresh, spec, max_tokens, f"bench-lmeval-{short}-{r}"), None
    if arm == "direct_ov":
        # a fresh engine: its prefix cache has never seen lm-eval's questions
        engine = inprocess.load_engine(OV_SPEC)
        # warmed on a full set of other questions: OpenVINO compiles kernels per
        # new batch shape on first use, which the worker's engine has long done
        warm_rows = data.arithmetic_rows(n, seed=3000 + r, prefix=f"w{r}-")
        engine.generate(inprocess.prepare(engine, warm_rows, max_tokens).requests)
        revision = engine.revision
        out = arms.direct_engine(engine, rows, max_tokens)
        engine.close()
        return out, revision
    fresh_in_process = data.arithmetic_rows(n, seed=2000 + r, prefix=f"e{r}-")
    return arms.pipeline_in_process(fresh_in_process, OV_SPEC, max_tokens, f"bench-lmeval-ovp-{r}"), None


def repeat_ratios(rep: dict[str, Any], backends: list[lmeval.Backend], faithful: list[str]) -> None:
    """A repeat's answer agreements and speed ratios, against lm-eval's fastest faithful
    backend in that repeat."""
    rep["compare_hf_ov"] = arms.evalctl_compare(rep["pipeline_hf"]["run_id"], rep["pipeline_ov"]["run_id"])
    ov_answers = inprocess.responses(rep["pipeline_ov"]["run_id"])
    hf_answers = inprocess.responses(rep["pipeline_hf"]["run_id"])
    rep["same_answers"] = {
        # the same questions: ov fp32 engine (direct) vs lm-eval's backends
        **{
            f"ov_direct_vs_lmeval_{b.name}": arms.same_share(
                rep["direct_ov"]["responses"], rep[CLI_ARM[b.name]]["responses"]
            )
            for b in backends
        },
        **{
            f"lmeval_{b.name}_vs_lmeval_hf": arms.same_share(
                rep[CLI_ARM[b.name]]["responses"], rep["lmeval_cli"]["responses"]
            )
            for b in backends[1:]
        },
        "ov_pipeline_vs_hf_pipeline": arms.same_share(ov_answers, hf_answers),
    }
    ref_cli = min((CLI_ARM[k] for k in faithful), key=lambda a: rep[a]["seconds"])
    ref_gen = min((GEN_ARM[k] for k in faithful), key=lambda a: rep[a]["generate_s"])
    rep["lmeval_reference"] = {"whole_process": ref_cli, "generation_only": ref_gen}
    lmeval_cli_s, lmeval_gen_s = rep[ref_cli]["seconds"], rep[ref_gen]["generate_s"]
    rep["ratios"] = {
        "whole_process_ov": round(lmeval_cli_s / rep["pipeline_ov"]["seconds"], 4),
        "whole_process_hf": round(lmeval_cli_s / rep["pipeline_hf"]["seconds"], 4),
        **{
            f"whole_process_ov_vs_lmeval_{b.name}": round(
                rep[CLI_ARM[b.name]]["seconds"] / rep["pipeline_ov"]["seconds"], 4
            )
            for b in backends
        },
        "generation_only_ov_direct": round(lmeval_gen_s / rep["direct_ov"]["seconds"], 4),
        **{
            f"generation_only_ov_direct_vs_lmeval_{b.name}": round(
                rep[GEN_ARM[b.name]]["generate_s"] / rep["direct_ov"]["seconds"], 4
            )
            for b in backends
        },
        "generation_only_ov_engine_busy": round(
            lmeval_gen_s / max(1e-9, rep["pipeline_ov"]["engine_busy_s"]), 4
        ),
        "pipeline_over_direct_ov": round(
            rep["pipeline_ov_in_process"]["items_per_s"] / rep["direct_ov"]["items_per_s"], 4
        ),
    }


def run_repeats(
    setup: Setup,
    drivers: dict[str, lmeval.LmEval],
    sweep: lmeval.Sweep,
    rows: list[dict[str, Any]],
    size: Sizes,
) -> tuple[list[dict[str, Any]], profiled.Budget, str]:
    """Every arm per repeat, in rotating order; the repeats, the time allowance and the
    direct engine's revision."""
    backends = setup.backends
    arm_names = [
        *(CLI_ARM[b.name] for b in backends),
        *(GEN_ARM[b.name] for b in backends),
        "pipeline_ov",
        "pipeline_hf",
        "direct_ov",
        "pipeline_ov_in_process",
    ]
    by_arm = {
        **{CLI_ARM[b.name]: ("cli", b) for b in backends},
        **{GEN_ARM[b.name]: ("gen", b) for b in backends},
    }
    reps: list[dict[str, Any]] = []
    revision = ""
    budget = profiled.Budget(2400, 1)
    for r in budget.range(size.repeats):
        rep: dict[str, Any] = {}
        for arm in arm_names[r % len(arm_names) :] + arm_names[: r % len(arm_names)]:
            rep[arm], rev = run_arm(arm, r, rows, size, drivers, sweep, by_arm)
            revision = rev if rev is not None else revision
            recording.log(f"repeat {r} {arm}: {rep[arm].get('seconds', rep[arm].get('elapsed_s'))} s")
        repeat_ratios(rep, backends, sweep.faithful)
        recording.log(
            f"repeat {r}: {rep['ratios']}, hf↔ov identical {rep['compare_hf_ov']['identical_share']}"
        )
        for arm in (*by_arm, "direct_ov"):
            rep[arm] = {k: v for k, v in rep[arm].items() if k not in ("responses", "first_prompt")}
        reps.append(rep)
    return reps, budget, revision


def goals(
    reps: list[dict[str, Any]], setup: Setup, sweep: lmeval.Sweep, size: Sizes, lm_version: Any
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """The medians of the ratios, and the goals of issue 17 against them."""
    med = pure.med
    ratios = {k: med([x["ratios"][k] for x in reps]) for k in reps[0]["ratios"]}
    identical = med([x["compare_hf_ov"]["identical_share"] for x in reps])
    p_values = [x["compare_hf_ov"]["mcnemar"]["p_value"] for x in reps]
    loads = [
        x[a]["loadavg_1m"]
        for x in reps
        for a in (*(CLI_ARM[b.name] for b in setup.backends), "pipeline_ov", "pipeline_hf")
    ]
    best = "; ".join(
        f"{k}: CLI batch {sweep.best_cli[k]}, generate {sweep.best_gen[k]}" for k in sweep.best_cli
    )
    note = (
        f"{size.n} questions, ≤ {size.max_tokens} new tokens, lm-eval {lm_version} at its fastest faithful "
        f"backend ({', '.join(sweep.faithful)}) and best batch of {size.sweep} ({best}); pipeline `{OV_SPEC}` "
        f"fp32; median of {len(reps)} repeats, load average {min(loads):.1f}–{max(loads):.1f} on "
        f"{os.cpu_count()} cores"
    )

    whole, gen, direct = (
        ratios[k] for k in ("whole_process_ov", "generation_only_ov_direct", "pipeline_over_direct_ov")
    )
    p_min = min(p_values) if p_values else None
    table = [  # id, benchmark, goal, value, met, unit
        ("2a", "vs lm-eval, whole process (lm_eval CLI ÷ evalctl submit --wait, seconds)", "≥ 2×",
         whole, (whole or 0) >= 2.0, "×"),
        ("2b", "vs lm-eval, generation only (generate_until ÷ ov engine direct)", "≥ 1.5×",
         gen, (gen or 0) >= 1.5, "×"),
        ("2c", "answers identical to the hf fp32 engine (evalctl compare)", "≥ 95 %",
         (identical or 0) * 100, (identical or 0) >= 0.95, " %"),
        ("2d", "accuracy difference ov vs hf (McNemar exact p, largest of repeats)", "p ≥ 0.05",
         p_min, p_min is not None and p_min >= 0.05, ""),
        ("2e", "pipeline ÷ the same engine called directly (ov, items/s)", "≥ 0.95",
         direct, (direct or 0) >= 0.95, ""),
    ]  # fmt: skip
    rows = [
        pure.goal_row(i, name, target, f"{pure.fmt_num(value)}{unit}", met, note)
        for i, name, target, value, met, unit in table
    ]
    return {**ratios, "identical_hf_ov": identical}, rows


def medians(reps: list[dict[str, Any]], ratios: dict[str, float | None], with_ov: bool) -> dict[str, Any]:
    """The ratios' medians, then each arm's seconds (lm-eval's openvino arms where they ran)."""
    columns = [  # (name, arm, field)
        ("lmeval_cli_s", "lmeval_cli", "seconds"),
        ("lmeval_cli_ov_s", "lmeval_cli_ov", "seconds"),
        ("pipeline_ov_s", "pipeline_ov", "seconds"),
        ("pipeline_hf_s", "pipeline_hf", "seconds"),
        ("lmeval_generate_s", "lmeval_generate", "generate_s"),
        ("lmeval_generate_ov_s", "lmeval_generate_ov", "generate_s"),
        ("direct_ov_s", "direct_ov", "seconds"),
    ]
    lmeval_ov = {"lmeval_cli_ov", "lmeval_generate_ov"}
    return {
        **ratios,
        **{
            name: pure.med([x[arm][field] for x in reps])
            for name, arm, field in columns
            if with_ov or arm not in lmeval_ov
        },
    }


def main() -> None:
    args, size = parse_sizes()
    started = time.monotonic()
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    rows = data.arithmetic_rows(size.n, seed=2)
    data.write_jsonl(DATA, rows)
    setup = set_up_lmeval()
    warm_worker(rows)
    drivers = {b.name: lmeval.LmEval(b, size.max_tokens) for b in setup.backends}
    try:
        recording.log(f"lm-eval drivers ready: {[d.ready for d in drivers.values()]}")
        sweep = lmeval.sweep(setup.backends, drivers, size.sweep, size.max_tokens, size.limit, FAITHFUL_SHARE)
        setup.ov_backend["answers_identical_to_lmeval_hf"] = sweep.agreement.get("openvino")
        reps, budget, revision = run_repeats(setup, drivers, sweep, rows, size)
    finally:
        for d in drivers.values():
            d.close()
    first_prompt = sweep.gen["hf"][0].get("first_prompt")
    engine_prompt = inprocess.pipeline_prompt(setup.model_dir, rows, first_prompt)
    lm_version = drivers["hf"].ready.get("lm_eval")
    ratios, goal_rows = goals(reps, setup, sweep, size, lm_version)
    settings = setup.settings
    recording.write_result(
        NAME,
        {
            "time_allowance": budget.as_dict(),
            "params": {
                "questions": size.n,
                "max_tokens": size.max_tokens,
                "sweep": size.sweep,
                "repeats": size.repeats,
                "model_dir": str(setup.model_dir),
                "lmeval_version": lm_version,
                "engines": {"ov": OV_SPEC, "hf": HF_SPEC},
                "worker_batch_limits": {
                    "ov": settings.batch_limits(OV_SPEC, "cpu"),
                    "hf": settings.batch_limits(HF_SPEC, "cpu"),
                },
                "ov_scheduler": {
                    "max_batched_tokens": settings.ov_max_batched_tokens,
                    "max_sequences": settings.ov_max_sequences,
                    "kv_cache_gb": settings.ov_kv_cache_gb,
                },
                "ov_revision": revision,
            },
            "lmeval_venv": setup.venv,
            "lmeval_openvino_backend": setup.ov_backend,
            "lmeval_start": {
                k: {x: v for x, v in d.ready.items() if x != "ready"} for k, d in drivers.items()
            },
            "prompts_identical": engine_prompt is not None and engine_prompt == first_prompt,
            "first_prompt": first_prompt,
            **sweep.record(),
            "repeats": reps,
            "medians": medians(reps, ratios, "openvino" in drivers),
            "goals": goal_rows,
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
