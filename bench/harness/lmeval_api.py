"""lm-eval's `local-completions` against an OpenAI-compatible provider (bench/api_limit.py):
its task for a data set, its `num_concurrent` sweep in one process (bench/lmeval/api_sweep.py)
and one run of its CLI from start to exit, each with the provider's counts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.harness import benchstack, paths, recording
from bench.harness.provider import Provider, usage
from bench.harness.venvs import VENV

MODEL = "fake-model"
TASK = "evalstream_api_qa"
MAX_TOKENS = 16
LMEVAL_MAX_RETRIES = 10


def write_task(folder: Path, dataset: Path) -> Path:
    """lm-eval's task for `dataset`: the pipeline's "exact" prompt as plain text, greedy,
    MAX_TOKENS new tokens, exact match."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(dataset))}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}\\n\\nAnswer in a few words."\n'
        'doc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n"
        '  until: ["\\n\\n"]\n  do_sample: false\n  temperature: 0.0\n'
        f"  max_gen_toks: {MAX_TOKENS}\n"
        "metric_list:\n"
        "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "    ignore_case: true\n    ignore_punctuation: true\n"
        "metadata:\n  version: 1.0\n"
    )
    return folder


def lmeval_sweep(
    provider: Provider, task_dir: Path, items: int, sweep: list[int], burst: float
) -> list[dict[str, Any]]:
    """Every `num_concurrent` value in one lm-eval process (bench/lmeval/api_sweep.py), each
    timed around its `simple_evaluate`: start-up is paid once, outside the comparison."""
    cmd = [
        str(VENV / "bin" / "python"),
        str(paths.BENCH / "lmeval" / "api_sweep.py"),
        "--task-dir",
        str(task_dir),
        "--task",
        TASK,
        "--base-url",
        provider.url,
        "--model",
        MODEL,
        "--max-retries",
        str(LMEVAL_MAX_RETRIES),
        "--concurrency",
        *map(str, sweep),
    ]
    log = benchstack.stack_dir() / "logs" / "bench-lmeval-api.log"
    with log.open("a") as f:
        proc = subprocess.run(cmd, cwd=task_dir, stdout=subprocess.PIPE, stderr=f, text=True, timeout=3600)
    out = []
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        res = usage(r["stats"], items, r["t0"], r["t1"], provider.rps, burst)
        res.update(num_concurrent=r["num_concurrent"], error=r["error"])
        recording.log(
            f"lm-eval num_concurrent={r['num_concurrent']}: {res['wall_s']} s (simple_evaluate), "
            f"429 {res['rate_limited']}/{res['requests']}, capacity share {res['capacity_share']}"
            + (f", failed: {r['error']}" if r["error"] else "")
        )
        out.append(res)
    if proc.returncode != 0 or not out:
        raise RuntimeError(f"the lm-eval sweep failed (rc {proc.returncode}); see {log}")
    return out


def lmeval_arm(
    provider: Provider, task_dir: Path, items: int, concurrent: int, burst: float
) -> dict[str, Any]:
    provider.reset()
    out_dir = task_dir / f"out-{concurrent}-{time.time_ns()}"
    model_args = ",".join(
        [
            f"model={MODEL}",
            f"base_url={provider.url}/completions",
            f"num_concurrent={concurrent}",
            f"max_retries={LMEVAL_MAX_RETRIES}",
            "tokenizer_backend=None",
            "tokenized_requests=False",
        ]
    )
    cmd = [
        str(VENV / "bin" / "lm_eval"),
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        TASK,
        "--include_path",
        str(task_dir),
        "--batch_size",
        "1",
        "--output_path",
        str(out_dir),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = benchstack.stack_dir() / "logs" / "bench-lmeval-api.log"
    t0 = time.monotonic()
    with log.open("a") as f:
        proc = subprocess.run(cmd, cwd=task_dir, stdout=f, stderr=f, env=env, timeout=3600)
    out = usage(provider.stats(), items, t0, time.monotonic(), provider.rps, burst)
    out["num_concurrent"] = concurrent
    out["rc"] = proc.returncode
    results = sorted(out_dir.rglob("results_*.json"))
    if proc.returncode == 0 and results:
        doc = json.loads(results[-1].read_text())
        out["accuracy"] = doc["results"][TASK].get("exact_match,none")
        out["samples"] = doc.get("n-samples", {}).get(TASK, {}).get("effective")
    shutil.rmtree(out_dir, ignore_errors=True)
    return out
