"""Runs lm-evaluation-harness for bench/against_lmeval.py, inside bench/.venv-lmeval.

Loads one lm-eval backend once on the model folder it is given (`hf`: HFLM on the
safetensors; `openvino`: OptimumLM on an optimum-intel IR, run from bench/.venv-lmeval-ov with
an OpenVINO config file), then answers one
JSON command per stdin line, `{"batch_size": B, "limit": N|null}`, with one JSON line on
stdout: the wall time of `simple_evaluate` on the evalstream_short_qa task (task set-up,
generation, scoring; the model is already loaded, as a pipeline worker's is), the part of
it spent in `generate_until`, exact match, and every response (to compare with the
pipeline's). Model loading is timed once and reported on the first line.

Standard library + lm_eval only: it runs in lm-eval's own virtual environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TASK = "evalstream_short_qa"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--max-gen-toks", type=int, required=True)
    ap.add_argument("--backend", choices=("hf", "openvino"), default="hf")
    ap.add_argument("--ov-config", help="OpenVINO config JSON (the openvino backend)")
    args = ap.parse_args()
    # Nothing is fetched from a hub: local model folder, local JSONL.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.chdir(HERE)  # the task's data_files path is relative to this folder
    # stdout carries the protocol only: whatever lm-eval prints goes to stderr
    global _PROTO
    _PROTO = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    t0 = time.perf_counter()
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    imported = time.perf_counter() - t0
    # the same thread count the pipeline's HFEngine uses: every core this process may use
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    t1 = time.perf_counter()
    if args.backend == "openvino":
        from lm_eval.models.optimum_lm import OptimumLM

        lm = OptimumLM(pretrained=args.model_dir, device="cpu", batch_size=1, ov_config=args.ov_config)
    else:
        lm = HFLM(pretrained=args.model_dir, dtype="float32", device="cpu", batch_size=1)
    load_s = time.perf_counter() - t1
    tasks = TaskManager(include_path=str(HERE))
    emit(
        {
            "ready": True,
            "backend": args.backend,
            "import_s": round(imported, 3),
            "load_s": round(load_s, 3),
            "lm_eval": _version(),
        }
    )

    generate = lm.generate_until
    spent: dict[str, float] = {"generate_s": 0.0}

    def timed_generate(requests: Any, disable_tqdm: bool = False) -> Any:
        t = time.perf_counter()
        try:
            return generate(requests, disable_tqdm=True)
        finally:
            spent["generate_s"] += time.perf_counter() - t

    lm.generate_until = timed_generate
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        lm.batch_size_per_gpu = int(cmd["batch_size"])
        spent["generate_s"] = 0.0
        t = time.perf_counter()
        out = simple_evaluate(
            model=lm,
            tasks=[TASK],
            task_manager=tasks,
            apply_chat_template=True,
            gen_kwargs={"max_gen_toks": args.max_gen_toks},
            limit=cmd.get("limit"),
            log_samples=True,
            bootstrap_iters=0,
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=0,
        )
        seconds = time.perf_counter() - t
        assert out is not None
        samples = out["samples"][TASK]
        emit(
            {
                "batch_size": lm.batch_size_per_gpu,
                "items": len(samples),
                "seconds": round(seconds, 3),
                "generate_s": round(spent["generate_s"], 3),
                "exact_match": out["results"][TASK].get("exact_match,none"),
                "first_prompt": samples[0]["arguments"][0][0] if samples else None,
                "responses": {str(s["doc"]["id"]): s["filtered_resps"][0] for s in samples},
            }
        )


_PROTO: Any = sys.stdout


def emit(obj: dict[str, Any]) -> None:
    _PROTO.write(json.dumps(obj) + "\n")
    _PROTO.flush()


def _version() -> str:
    from importlib import metadata

    return metadata.version("lm-eval")


if __name__ == "__main__":
    main()
