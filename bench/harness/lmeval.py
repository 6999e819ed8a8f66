"""lm-eval as the reference the benchmarks compare with: a backend (hf, or openvino on an
optimum-intel IR), its driver process (bench/lmeval/driver.py: the model loaded once, one
`simple_evaluate` per call) and its CLI from start to exit, as a user runs it, on the task in
bench/lmeval/ (the short questions of bench/against_lmeval.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.harness import benchstack, interference, paths, recording
from bench.harness.arms import same_share
from bench.harness.recording import log
from bench.harness.venvs import OPTIMUM_INTEL, VENV_OV, ensure_lmeval_venv

TASK_DIR = paths.BENCH / "lmeval"
# the pipeline's faithful ov: settings (engines/ov.py FP32_PROPERTIES); CACHE_DIR off, as lm-eval sets it
OV_FP32_CONFIG = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
    "CACHE_DIR": "",
}


def bundled_model_files() -> Path:
    """The bundled model's safetensors folder, as the worker's hf engine reads it: lm-eval
    loads the same files."""
    from evalstream.common.settings import Settings
    from evalstream.worker.engines import bundled_model_path
    from evalstream.worker.engines.hf import ensure_safetensors_cache, file_sha256

    gguf = bundled_model_path("smollm2-135m-instruct")
    cache = Path(Settings.from_env().resolved_model_cache_dir)
    return ensure_safetensors_cache(gguf, cache, file_sha256(gguf))


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


OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_cli(
    argv: list[str], *, cwd: Path, log_name: str, out_dir: Path, task: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """lm-eval's CLI (`argv`, writing its samples under `out_dir`) offline from start to exit,
    its output in the bench stack's logs/`log_name`: the samples of `task`, one per document,
    and the timing (seconds, the load average at the start, the cores other programs kept
    busy). `out_dir` is removed."""
    env = {**os.environ, **OFFLINE_ENV}
    other = interference.Interference()
    load = os.getloadavg()[0]
    with (benchstack.stack_dir() / "logs" / log_name).open("a") as log:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=log, stderr=log)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"lm_eval exited with {proc.returncode}; see {log.name}")
    path = next(out_dir.rglob(f"samples_{task}_*.jsonl"))
    samples = [json.loads(line) for line in path.read_text().splitlines()]
    shutil.rmtree(out_dir, ignore_errors=True)
    return samples, {"seconds": seconds, "loadavg_1m": load, "other_load_cores": other.cores()}


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
    samples, timing = run_cli(
        argv, cwd=TASK_DIR, log_name="bench-lmeval-cli.log", out_dir=out_dir, task="evalstream_short_qa"
    )
    responses = {str(s["doc"]["id"]): s["filtered_resps"][0] for s in samples}
    seconds = timing["seconds"]
    return {
        "backend": backend.name,
        "batch_size": batch_size,
        "items": len(responses),
        "seconds": round(seconds, 3),
        "items_per_s": round(len(responses) / seconds, 3),
        "loadavg_1m": round(timing["loadavg_1m"], 2),
        "other_load_cores": timing["other_load_cores"],
        "responses": responses,
    }


def backends(model_dir: Path, hf_venv: Path) -> tuple[list[Backend], dict[str, Any]]:
    """lm-eval's hf backend on `model_dir`, and its openvino backend where its venv installs
    (an fp32 IR exported from the same safetensors, the pipeline's fp32 OpenVINO settings);
    with what became of the openvino backend."""
    found = [Backend("hf", hf_venv, model_dir)]
    try:
        venv_ov = ensure_lmeval_venv(VENV_OV, (OPTIMUM_INTEL,), "import lm_eval, optimum.intel")
        ir = ensure_optimum_ir(model_dir)
        ov_config = benchstack.stack_dir() / "lmeval-ov-config.json"
        ov_config.write_text(json.dumps(OV_FP32_CONFIG))
        found.append(Backend("openvino", VENV_OV, Path(ir["path"]), ov_config))
        ov_backend: dict[str, Any] = {"run": True, "venv": venv_ov, "ir": ir, "ov_config": OV_FP32_CONFIG}
        log(f"lm-eval openvino backend: venv {venv_ov}; IR {ir}")
    except (subprocess.CalledProcessError, OSError) as e:
        ov_backend = {"run": False, "why": f"{type(e).__name__}: {e}"}
        log(f"lm-eval's openvino backend is not run: {ov_backend['why']}")
    return found, ov_backend


@dataclass
class Sweep:
    """lm-eval's batch sizes swept: its best per backend, and which backends are faithful."""

    cli: dict[str, list[dict[str, Any]]]
    gen: dict[str, list[dict[str, Any]]]
    best_cli: dict[str, int]
    best_gen: dict[str, int]
    faithful: list[str]
    agreement: dict[str, float]  # each backend's answers identical to its hf backend's

    def record(self) -> dict[str, Any]:
        """The sweep as a result file keeps it (without the answers)."""
        return {
            "lmeval_faithful_backends": self.faithful,
            "lmeval_cli_sweep": [
                {k: v for k, v in x.items() if k != "responses"} for runs in self.cli.values() for x in runs
            ],
            "lmeval_generate_sweep": [
                {k: v for k, v in x.items() if k not in ("responses", "first_prompt")}
                for runs in self.gen.values()
                for x in runs
            ],
            "best_batch_size": {"cli": self.best_cli, "generate": self.best_gen},
        }


def sweep(
    backends: list[Backend],
    drivers: dict[str, LmEval],
    batch_sizes: list[int],
    max_tokens: int,
    limit: int | None,
    faithful_share: float,
) -> Sweep:
    """lm-eval's CLI and driver over the batch sizes; its best batch per backend; the backends
    whose answers at their best batch are lm-eval hf's (fp32) on at least `faithful_share` of
    items."""
    cli_sweep: dict[str, list[dict[str, Any]]] = {b.name: [] for b in backends}
    gen_sweep: dict[str, list[dict[str, Any]]] = {b.name: [] for b in backends}
    for bs in batch_sizes:
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
    hf_answers = next(c for c in cli_sweep["hf"] if c["batch_size"] == best_cli["hf"])["responses"]
    agreement = {
        k: same_share(next(c for c in v if c["batch_size"] == best_cli[k])["responses"], hf_answers)
        for k, v in cli_sweep.items()
    }
    faithful = [k for k, share in agreement.items() if share >= faithful_share]
    recording.log(f"lm-eval backends' agreement with its hf backend: {agreement}; faithful: {faithful}")
    return Sweep(cli_sweep, gen_sweep, best_cli, best_gen, faithful, agreement)
