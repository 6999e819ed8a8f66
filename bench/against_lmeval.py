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
average and the cores other programs kept busy during each arm (bench/interference.py).
Goals (issue 17): whole process ≥ 2×, generation only ≥ 1.5×, ≥ 95 % answers identical to
the hf fp32 engine with an accuracy difference that is not significant (McNemar p ≥ 0.05),
pipeline ÷ direct engine ≥ 0.95.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import benchstack, data, inprocess, interference, paths, pipeline_runs, profiled, pure, recording

NAME = "against_lmeval"
LMEVAL_VERSION = "0.4.13"
VENV = paths.BENCH / ".venv-lmeval"
VENV_OV = paths.BENCH / ".venv-lmeval-ov"
OPTIMUM_INTEL = "optimum-intel[openvino]==2.2.0"
# the pipeline's faithful ov: settings (engines/ov.py FP32_PROPERTIES); CACHE_DIR off, as lm-eval sets it
OV_FP32_CONFIG = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
    "CACHE_DIR": "",
}
FAITHFUL_SHARE = 0.95
TASK_DIR = paths.BENCH / "lmeval"
DATA = TASK_DIR / "short_qa.jsonl"


# ----------------------------------------------------------------------------- lm-eval's venv


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / f).lstat().st_size
    return total


def ensure_lmeval_venv(
    venv: Path = VENV, extras: tuple[str, ...] = (), probe: str = "import lm_eval"
) -> dict[str, Any]:
    """A venv with lm-eval (and `extras`), reusing the project's torch; created if missing."""
    py = venv / "bin" / "python"
    record = venv / "evalstream-install.json"  # what creating it cost, kept for later runs
    if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
        first = json.loads(record.read_text()) if record.exists() else None
        return {"created": False, "path": str(venv), "size_bytes": _dir_bytes(venv), "when_created": first}
    recording.log(
        f"creating {venv} with lm-eval {LMEVAL_VERSION} {' '.join(extras)} "
        "(the project's torch is shared, not reinstalled)"
    )
    shutil.rmtree(venv, ignore_errors=True)
    info = json.loads(
        subprocess.run(
            [
                str(paths.PY),
                "-c",
                "import sys, sysconfig, json; print(json.dumps([sys.base_prefix, sysconfig.get_paths()['purelib'],"
                " f'python{sys.version_info[0]}.{sys.version_info[1]}']))",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    base_prefix, project_site, pyver = info
    t0 = time.monotonic()
    subprocess.run([f"{base_prefix}/bin/python3", "-m", "venv", str(venv)], check=True)
    # Appended after the venv's own site-packages: lm-eval's dependencies win, torch,
    # transformers and accelerate come from the project (pip sees them as installed) unless
    # an extra pins another version, which then lands in the venv and shadows the project's.
    site = venv / "lib" / pyver / "site-packages"
    (site / "evalstream-project.pth").write_text(
        str(paths.ROOT / ".venv" / "lib" / pyver / "site-packages") + "\n"
    )
    assert Path(project_site).resolve() == (paths.ROOT / ".venv" / "lib" / pyver / "site-packages").resolve()
    paths.pip_install(py, f"lm-eval=={LMEVAL_VERSION}", *extras)
    seconds = time.monotonic() - t0
    torch_bytes = sum(
        _dir_bytes(p)
        for p in Path(project_site).iterdir()
        if p.name == "torch" or p.name.startswith("nvidia")
    )
    out = {
        "created": True,
        "path": str(venv),
        "install_s": round(seconds, 1),
        "size_bytes": _dir_bytes(venv),
        "shared_torch_bytes_not_downloaded": torch_bytes,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    record.write_text(json.dumps(out, indent=1))
    return out


@dataclass(frozen=True)
class Backend:
    """One lm-eval backend as the CLI and the driver run it."""

    name: str  # lm-eval's --model
    venv: Path
    model_dir: Path  # the safetensors (hf) or the optimum IR (openvino)
    ov_config: Path | None = None

    @property
    def model_args(self) -> str:
        if self.ov_config is not None:
            return f"pretrained={self.model_dir},ov_config={self.ov_config}"
        return f"pretrained={self.model_dir},dtype=float32"


def ensure_optimum_ir(model_dir: Path) -> dict[str, Any]:
    """lm-eval's openvino backend loads an optimum-intel IR: exported once, fp32 weights (no
    fp16 or int8 compression), from the same safetensors; kept in its venv (its optimum's)."""
    out = VENV_OV / "ir" / model_dir.name
    if (out / "openvino_model.xml").exists():
        return {"path": str(out), "exported": False}
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    argv = [
        str(VENV_OV / "bin" / "optimum-cli"),
        "export",
        "openvino",
        "--model",
        str(model_dir),
        "--task",
        "text-generation-with-past",
        "--weight-format",
        "fp32",
        str(tmp),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.monotonic()
    with (benchstack.stack_dir() / "logs" / "bench-optimum-export.log").open("a") as log:
        subprocess.run(argv, env=env, stdout=log, stderr=log, check=True)
    tmp.rename(out)
    return {"path": str(out), "exported": True, "export_s": round(time.monotonic() - t0, 1)}


class LmEval:
    """The driver process: model loaded once, one simple_evaluate per call."""

    def __init__(self, backend: Backend, max_gen_toks: int) -> None:
        self.backend = backend.name
        self.stderr = (benchstack.stack_dir() / "logs" / "bench-lmeval.log").open("a")
        self.proc = subprocess.Popen(
            [
                str(backend.venv / "bin" / "python"),
                str(TASK_DIR / "driver.py"),
                "--model-dir",
                str(backend.model_dir),
                "--max-gen-toks",
                str(max_gen_toks),
                "--backend",
                backend.name,
                *(["--ov-config", str(backend.ov_config)] if backend.ov_config else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        line = out.readline()
        if not line:
            raise RuntimeError(f"the lm-eval driver exited (rc {self.proc.wait()}); see {self.stderr.name}")
        return dict(json.loads(line))

    def evaluate(self, batch_size: int, limit: int | None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        other = interference.Interference()
        self.proc.stdin.write(json.dumps({"batch_size": batch_size, "limit": limit}) + "\n")
        self.proc.stdin.flush()
        res = self._read()
        res["backend"] = self.backend
        res["other_load_cores"] = other.cores()
        res["items_per_s"] = res["items"] / res["seconds"]
        return res

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stderr.close()


# ----------------------------------------------------------------------------- lm-eval's CLI


def lmeval_cli(backend: Backend, batch_size: int, max_tokens: int, limit: int | None) -> dict[str, Any]:
    """`lm_eval` as a user runs it, from start to exit; answers read from its samples file."""
    out_dir = Path(tempfile.mkdtemp(prefix="lmeval-cli-", dir=benchstack.stack_dir()))
    argv = [
        str(backend.venv / "bin" / "lm_eval"),
        "run",
        "--model",
        backend.name,
        "--model_args",
        backend.model_args,
        "--device",
        "cpu",
        "--tasks",
        "evalstream_short_qa",
        "--include_path",
        str(TASK_DIR),
        "--batch_size",
        str(batch_size),
        "--apply_chat_template",
        "--gen_kwargs",
        f"max_gen_toks={max_tokens}",
        "--output_path",
        str(out_dir),
        "--log_samples",
        "--seed",
        "0",
        *(["--limit", str(limit)] if limit else []),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    other = interference.Interference()
    load = os.getloadavg()[0]
    with (benchstack.stack_dir() / "logs" / "bench-lmeval-cli.log").open("a") as log:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=TASK_DIR, env=env, stdout=log, stderr=log)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"lm_eval exited with {proc.returncode}; see {log.name}")
    samples = next(out_dir.rglob("samples_evalstream_short_qa_*.jsonl"))
    responses = {}
    for line in samples.read_text().splitlines():
        s = json.loads(line)
        responses[str(s["doc"]["id"])] = s["filtered_resps"][0]
    shutil.rmtree(out_dir, ignore_errors=True)
    return {
        "backend": backend.name,
        "batch_size": batch_size,
        "items": len(responses),
        "seconds": round(seconds, 3),
        "items_per_s": round(len(responses) / seconds, 3),
        "loadavg_1m": round(load, 2),
        "other_load_cores": other.cores(),
        "responses": responses,
    }


# ----------------------------------------------------------------------------- the pipeline


def evalctl_submit_wait(rows: list[dict[str, Any]], spec: str, max_tokens: int, name: str) -> dict[str, Any]:
    """`evalctl submit --wait` as a user runs it, from start to exit (interpreter start,
    validation, upload, the whole run, its report); the answer cache emptied first."""
    path = data.write_jsonl(data.data_dir() / f"{name}.jsonl", rows)
    inprocess.clear_answer_cache()
    before = inprocess.engine_calls()
    other = interference.Interference()
    load = os.getloadavg()[0]
    argv = [
        str(paths.ROOT / ".venv" / "bin" / "evalctl"),
        "submit",
        str(path),
        "--model",
        spec,
        "--max-tokens",
        str(max_tokens),
        "--grader",
        "exact",
        "--name",
        name,
        "--wait",
        "--json",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=os.environ)
    seconds = time.perf_counter() - t0
    path.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise RuntimeError(f"evalctl submit --wait exited with {proc.returncode}: {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    calls = inprocess.delta(inprocess.engine_calls(), before)
    return {
        "spec": spec,
        "run_id": summary["run_id"],
        "items": len(rows),
        "seconds": round(seconds, 3),
        "items_per_s": round(len(rows) / seconds, 3),
        "failed": summary.get("failed"),
        "cache_hits": summary.get("cache_hits"),
        "accuracy": summary.get("accuracy"),
        "engine_busy_s": calls["engine_busy_s"],
        "engine_batches": calls["batches"],
        "loadavg_1m": round(load, 2),
        "other_load_cores": other.cores(),
    }


def evalctl_compare(run_a: str, run_b: str) -> dict[str, Any]:
    """`evalctl compare A B --json`: identical answers, accuracy delta, McNemar."""
    proc = subprocess.run(
        [str(paths.ROOT / ".venv" / "bin" / "evalctl"), "compare", run_a, run_b, "--json"],
        capture_output=True,
        text=True,
        env=os.environ,
        check=True,
    )
    c = json.loads(proc.stdout.strip().splitlines()[-1])
    common = c["items"]["common"]
    return {
        "runs": [run_a, run_b],
        "items": common,
        "identical_answers": c["identical_responses"],
        "identical_share": round(c["identical_responses"] / common, 4) if common else None,
        "accuracy": c["accuracy"],
        "mcnemar": c["mcnemar"],
    }


def direct_engine(engine: Any, rows: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The engine called directly, in this process, with the worker's batching plan."""
    prepared = inprocess.prepare(engine, rows, max_tokens)
    plan = inprocess.default_plan(prepared, engine)
    other = interference.Interference()
    load = os.getloadavg()[0]
    run = inprocess.run_engine(engine, prepared, plan)
    return {
        "spec": engine.name,
        "items": run.items,
        "seconds": round(run.seconds, 3),
        "items_per_s": round(run.items_per_s, 3),
        "batches": [len(b) for b in plan],
        "tokens_out": run.completion_tokens,
        "loadavg_1m": round(load, 2),
        "other_load_cores": other.cores(),
        "responses": {r["id"]: getattr(o, "text", None) for r, o in zip(rows, run.outputs, strict=True)},
    }


def pipeline_in_process(rows: list[dict[str, Any]], spec: str, max_tokens: int, name: str) -> dict[str, Any]:
    """Submit (in process) → every result in PostgreSQL: the pipeline around the engine."""
    inprocess.clear_answer_cache()
    other = interference.Interference()
    load = os.getloadavg()[0]
    run = pipeline_runs.run_pipeline(
        rows, "--model", spec, "--max-tokens", str(max_tokens), "--grader", "exact", name=name
    )
    return {**run.as_dict(), "loadavg_1m": round(load, 2), "other_load_cores": other.cores()}


def same_share(a: dict[str, Any], b: dict[str, Any]) -> float:
    keys = a.keys() & b.keys()
    same = sum(1 for k in keys if str(a[k] or "").strip() == str(b[k] or "").strip())
    return round(same / len(keys), 4) if keys else 0.0


def med(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def pipeline_prompt(model_dir: Path, rows: list[dict[str, Any]], like: str | None) -> str | None:
    """The prompt a worker renders for the row that `like` (lm-eval's first prompt) asks,
    through the worker's own message building and the model's chat template."""
    from transformers import AutoTokenizer

    from evalstream.common.messages import GenerationParams, Item, Shard
    from evalstream.worker.prompting import build_messages

    row = next((r for r in rows if like and r["question"] in like), rows[0])
    item = Item(id=row["id"], question=row["question"], answer=row["answer"])
    shard = Shard(
        run_id="x",
        shard_id="x",
        shard_index=0,
        shard_count=1,
        model=paths.DEFAULT_MODEL,
        grader="exact",
        generation=GenerationParams(),
        items=[item],
    )
    messages = build_messages(shard, item, "exact")
    tok = AutoTokenizer.from_pretrained(model_dir)
    return str(
        tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )
    )


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of every arm (medians reported)")
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens at most (lm-eval's max_gen_toks)")
    ap.add_argument(
        "--questions", type=int, default=128, help="questions per run (fewer on a loaded machine)"
    )
    ap.add_argument("--sweep", default="8,32,128", help="lm-eval batch sizes to sweep (comma-separated)")
    args = ap.parse_args()
    started = time.monotonic()
    benchstack.use_bench_stack()
    benchstack.ensure_up()
    n, max_tokens = (args.questions, args.max_tokens) if not args.quick else (16, 8)
    sweep = [int(b) for b in args.sweep.split(",")] if not args.quick else [4, 16]
    repeats, limit = (args.repeats, None) if not args.quick else (1, None)
    rows = data.arithmetic_rows(n, seed=2)
    data.write_jsonl(DATA, rows)
    ov_spec, hf_spec = "ov:smollm2-135m-instruct", "hf:smollm2-135m-instruct"

    venv = ensure_lmeval_venv()
    from evalstream.common.settings import Settings
    from evalstream.worker.engines import bundled_model_path
    from evalstream.worker.engines.hf import ensure_safetensors_cache, file_sha256

    settings = Settings.from_env()
    gguf = bundled_model_path("smollm2-135m-instruct")
    model_dir = ensure_safetensors_cache(gguf, Path(settings.resolved_model_cache_dir), file_sha256(gguf))
    recording.log(f"lm-eval venv {venv}; model files {model_dir}")
    hf_backend = Backend("hf", VENV, model_dir)
    backends = [hf_backend]
    try:  # lm-eval's openvino backend, where its venv installs
        venv_ov = ensure_lmeval_venv(VENV_OV, (OPTIMUM_INTEL,), "import lm_eval, optimum.intel")
        ir = ensure_optimum_ir(model_dir)
        ov_config = benchstack.stack_dir() / "lmeval-ov-config.json"
        ov_config.write_text(json.dumps(OV_FP32_CONFIG))
        backends.append(Backend("openvino", VENV_OV, Path(ir["path"]), ov_config))
        ov_backend: dict[str, Any] = {"run": True, "venv": venv_ov, "ir": ir, "ov_config": OV_FP32_CONFIG}
        recording.log(f"lm-eval openvino backend: venv {venv_ov}; IR {ir}")
    except (subprocess.CalledProcessError, OSError) as e:
        ov_backend = {"run": False, "why": f"{type(e).__name__}: {e}"}
        recording.log(f"lm-eval's openvino backend is not run: {ov_backend['why']}")

    # the worker loads both engines once (the ov IR is converted on first use) before timing
    for spec in (ov_spec, hf_spec):
        warm = pipeline_runs.run_pipeline(
            rows[:2], "--model", spec, "--max-tokens", "4", name="bench-lmeval-warm"
        )
        recording.log(f"worker warm for {spec}: {warm.elapsed_s:.1f} s")
    revision = ""

    # arm names per backend: the CLI from start to exit, and generate_until in the driver
    cli_arm = {"hf": "lmeval_cli", "openvino": "lmeval_cli_ov"}
    gen_arm = {"hf": "lmeval_generate", "openvino": "lmeval_generate_ov"}
    drivers = {b.name: LmEval(b, max_tokens) for b in backends}
    try:
        recording.log(f"lm-eval drivers ready: {[d.ready for d in drivers.values()]}")
        cli_sweep: dict[str, list[dict[str, Any]]] = {b.name: [] for b in backends}
        gen_sweep: dict[str, list[dict[str, Any]]] = {b.name: [] for b in backends}
        for bs in sweep:
            for b in backends:
                cli = lmeval_cli(b, bs, max_tokens, limit)
                recording.log(
                    f"lm-eval {b.name} CLI batch {bs}: {cli['seconds']:.1f} s start to exit "
                    f"(load {cli['loadavg_1m']})"
                )
                cli_sweep[b.name].append(cli)
                gen = drivers[b.name].evaluate(bs, limit)
                recording.log(f"lm-eval {b.name} driver batch {bs}: generate {gen['generate_s']:.1f} s")
                gen_sweep[b.name].append(gen)
        best_cli = {k: min(v, key=lambda r: r["seconds"])["batch_size"] for k, v in cli_sweep.items()}
        best_gen = {k: min(v, key=lambda r: r["generate_s"])["batch_size"] for k, v in gen_sweep.items()}
        # faithful: its answers at its best batch are lm-eval hf's (fp32) on ≥ 95 % of items
        hf_answers = next(c for c in cli_sweep["hf"] if c["batch_size"] == best_cli["hf"])["responses"]
        agreement = {
            k: same_share(next(c for c in v if c["batch_size"] == best_cli[k])["responses"], hf_answers)
            for k, v in cli_sweep.items()
        }
        faithful = [k for k, share in agreement.items() if share >= FAITHFUL_SHARE]
        ov_backend["answers_identical_to_lmeval_hf"] = agreement.get("openvino")
        recording.log(f"lm-eval backends' agreement with its hf backend: {agreement}; faithful: {faithful}")

        arms = [
            *(cli_arm[b.name] for b in backends),
            *(gen_arm[b.name] for b in backends),
            "pipeline_ov",
            "pipeline_hf",
            "direct_ov",
            "pipeline_ov_in_process",
        ]
        by_arm = {
            **{cli_arm[b.name]: ("cli", b) for b in backends},
            **{gen_arm[b.name]: ("gen", b) for b in backends},
        }
        reps: list[dict[str, Any]] = []
        budget = profiled.Budget(2400, 1)
        for r in budget.range(repeats):
            rep: dict[str, Any] = {}
            # OpenVINO's prefix cache keeps whole prompts it has seen: every pipeline run asks
            # questions its worker has not seen (same generator, shape and length as lm-eval's
            # set); the ov and hf runs share theirs, so that evalctl compare pairs them
            fresh = data.arithmetic_rows(n, seed=1000 + r, prefix=f"p{r}-")
            fresh_in_process = data.arithmetic_rows(n, seed=2000 + r, prefix=f"e{r}-")
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                if arm in by_arm:
                    kind, b = by_arm[arm]
                    if kind == "cli":
                        rep[arm] = lmeval_cli(b, best_cli[b.name], max_tokens, limit)
                    else:
                        rep[arm] = drivers[b.name].evaluate(best_gen[b.name], limit)
                elif arm == "pipeline_ov":
                    rep[arm] = evalctl_submit_wait(fresh, ov_spec, max_tokens, f"bench-lmeval-ov-{r}")
                elif arm == "pipeline_hf":
                    rep[arm] = evalctl_submit_wait(fresh, hf_spec, max_tokens, f"bench-lmeval-hf-{r}")
                elif arm == "direct_ov":
                    # a fresh engine: its prefix cache has never seen lm-eval's questions
                    engine = inprocess.load_engine(ov_spec)
                    # warmed on a full set of other questions: OpenVINO compiles kernels per
                    # new batch shape on first use, which the worker's engine has long done
                    warm_rows = data.arithmetic_rows(n, seed=3000 + r, prefix=f"w{r}-")
                    engine.generate(inprocess.prepare(engine, warm_rows, max_tokens).requests)
                    revision = engine.revision
                    rep[arm] = direct_engine(engine, rows, max_tokens)
                    engine.close()
                else:
                    rep[arm] = pipeline_in_process(
                        fresh_in_process, ov_spec, max_tokens, f"bench-lmeval-ovp-{r}"
                    )
                recording.log(f"repeat {r} {arm}: {rep[arm].get('seconds', rep[arm].get('elapsed_s'))} s")
            rep["compare_hf_ov"] = evalctl_compare(rep["pipeline_hf"]["run_id"], rep["pipeline_ov"]["run_id"])
            ov_answers = inprocess.responses(rep["pipeline_ov"]["run_id"])
            hf_answers = inprocess.responses(rep["pipeline_hf"]["run_id"])
            rep["same_answers"] = {
                # the same questions: ov fp32 engine (direct) vs lm-eval's backends
                **{
                    f"ov_direct_vs_lmeval_{b.name}": same_share(
                        rep["direct_ov"]["responses"], rep[cli_arm[b.name]]["responses"]
                    )
                    for b in backends
                },
                **{
                    f"lmeval_{b.name}_vs_lmeval_hf": same_share(
                        rep[cli_arm[b.name]]["responses"], rep["lmeval_cli"]["responses"]
                    )
                    for b in backends[1:]
                },
                "ov_pipeline_vs_hf_pipeline": same_share(ov_answers, hf_answers),
            }
            # lm-eval's reference: its fastest faithful backend in this repeat
            ref_cli = min((cli_arm[k] for k in faithful), key=lambda a: rep[a]["seconds"])
            ref_gen = min((gen_arm[k] for k in faithful), key=lambda a: rep[a]["generate_s"])
            rep["lmeval_reference"] = {"whole_process": ref_cli, "generation_only": ref_gen}
            lmeval_cli_s, lmeval_gen_s = rep[ref_cli]["seconds"], rep[ref_gen]["generate_s"]
            rep["ratios"] = {
                "whole_process_ov": round(lmeval_cli_s / rep["pipeline_ov"]["seconds"], 4),
                "whole_process_hf": round(lmeval_cli_s / rep["pipeline_hf"]["seconds"], 4),
                **{
                    f"whole_process_ov_vs_lmeval_{b.name}": round(
                        rep[cli_arm[b.name]]["seconds"] / rep["pipeline_ov"]["seconds"], 4
                    )
                    for b in backends
                },
                "generation_only_ov_direct": round(lmeval_gen_s / rep["direct_ov"]["seconds"], 4),
                **{
                    f"generation_only_ov_direct_vs_lmeval_{b.name}": round(
                        rep[gen_arm[b.name]]["generate_s"] / rep["direct_ov"]["seconds"], 4
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
            recording.log(
                f"repeat {r}: {rep['ratios']}, hf↔ov identical {rep['compare_hf_ov']['identical_share']}"
            )
            for arm in (*by_arm, "direct_ov"):
                rep[arm] = {k: v for k, v in rep[arm].items() if k not in ("responses", "first_prompt")}
            reps.append(rep)
    finally:
        for d in drivers.values():
            d.close()

    first_prompt = gen_sweep["hf"][0].get("first_prompt")
    engine_prompt = pipeline_prompt(model_dir, rows, first_prompt)
    ratio_names = list(reps[0]["ratios"])
    ratios = {k: med([x["ratios"][k] for x in reps]) for k in ratio_names}
    identical = med([x["compare_hf_ov"]["identical_share"] for x in reps])
    p_values = [x["compare_hf_ov"]["mcnemar"]["p_value"] for x in reps]
    loads = [
        x[a]["loadavg_1m"]
        for x in reps
        for a in (*(cli_arm[b.name] for b in backends), "pipeline_ov", "pipeline_hf")
    ]
    lm_version = drivers["hf"].ready.get("lm_eval")
    best = "; ".join(f"{k}: CLI batch {best_cli[k]}, generate {best_gen[k]}" for k in best_cli)
    note = (
        f"{n} questions, ≤ {max_tokens} new tokens, lm-eval {lm_version} at its fastest faithful backend "
        f"({', '.join(faithful)}) and best batch of {sweep} ({best}); pipeline `{ov_spec}` fp32; median of "
        f"{len(reps)} repeats, load average {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores"
    )

    def goal(
        i: str, name: str, target: str, value: float | None, ok: bool, unit: str = "×"
    ) -> dict[str, Any]:
        return pure.goal_row(i, name, target, f"{pure.fmt_num(value)}{unit}", ok, note)

    goals = [
        goal(
            "2a",
            "vs lm-eval, whole process (lm_eval CLI ÷ evalctl submit --wait, seconds)",
            "≥ 2×",
            ratios["whole_process_ov"],
            (ratios["whole_process_ov"] or 0) >= 2.0,
        ),
        goal(
            "2b",
            "vs lm-eval, generation only (generate_until ÷ ov engine direct)",
            "≥ 1.5×",
            ratios["generation_only_ov_direct"],
            (ratios["generation_only_ov_direct"] or 0) >= 1.5,
        ),
        goal(
            "2c",
            "answers identical to the hf fp32 engine (evalctl compare)",
            "≥ 95 %",
            (identical or 0) * 100,
            (identical or 0) >= 0.95,
            " %",
        ),
        goal(
            "2d",
            "accuracy difference ov vs hf (McNemar exact p, largest of repeats)",
            "p ≥ 0.05",
            min(p_values) if p_values else None,
            bool(p_values) and min(p_values) >= 0.05,
            "",
        ),
        goal(
            "2e",
            "pipeline ÷ the same engine called directly (ov, items/s)",
            "≥ 0.95",
            ratios["pipeline_over_direct_ov"],
            (ratios["pipeline_over_direct_ov"] or 0) >= 0.95,
            "",
        ),
    ]
    recording.write_result(
        NAME,
        {
            "time_allowance": budget.as_dict(),
            "params": {
                "questions": n,
                "max_tokens": max_tokens,
                "sweep": sweep,
                "repeats": repeats,
                "model_dir": str(model_dir),
                "lmeval_version": lm_version,
                "engines": {"ov": ov_spec, "hf": hf_spec},
                "worker_batch_limits": {
                    "ov": settings.batch_limits(ov_spec, "cpu"),
                    "hf": settings.batch_limits(hf_spec, "cpu"),
                },
                "ov_scheduler": {
                    "max_batched_tokens": settings.ov_max_batched_tokens,
                    "max_sequences": settings.ov_max_sequences,
                    "kv_cache_gb": settings.ov_kv_cache_gb,
                },
                "ov_revision": revision,
            },
            "lmeval_venv": venv,
            "lmeval_openvino_backend": ov_backend,
            "lmeval_faithful_backends": faithful,
            "lmeval_start": {
                k: {x: v for x, v in d.ready.items() if x != "ready"} for k, d in drivers.items()
            },
            "prompts_identical": engine_prompt is not None and engine_prompt == first_prompt,
            "first_prompt": first_prompt,
            "lmeval_cli_sweep": [
                {k: v for k, v in x.items() if k != "responses"} for runs in cli_sweep.values() for x in runs
            ],
            "lmeval_generate_sweep": [
                {k: v for k, v in x.items() if k not in ("responses", "first_prompt")}
                for runs in gen_sweep.values()
                for x in runs
            ],
            "best_batch_size": {"cli": best_cli, "generate": best_gen},
            "repeats": reps,
            "medians": {
                **ratios,
                "identical_hf_ov": identical,
                "lmeval_cli_s": med([x["lmeval_cli"]["seconds"] for x in reps]),
                **(
                    {"lmeval_cli_ov_s": med([x["lmeval_cli_ov"]["seconds"] for x in reps])}
                    if "openvino" in drivers
                    else {}
                ),
                "pipeline_ov_s": med([x["pipeline_ov"]["seconds"] for x in reps]),
                "pipeline_hf_s": med([x["pipeline_hf"]["seconds"] for x in reps]),
                "lmeval_generate_s": med([x["lmeval_generate"]["generate_s"] for x in reps]),
                **(
                    {"lmeval_generate_ov_s": med([x["lmeval_generate_ov"]["generate_s"] for x in reps])}
                    if "openvino" in drivers
                    else {}
                ),
                "direct_ov_s": med([x["direct_ov"]["seconds"] for x in reps]),
            },
            "goals": goals,
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    main()
