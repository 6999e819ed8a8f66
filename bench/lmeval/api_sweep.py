"""lm-eval's `num_concurrent` sweep for bench/api_limit.py, inside bench/.venv-lmeval.

One process, lm-eval imported once: for each value, the provider's counts are reset (POST
<base>/stats on the fake provider), `simple_evaluate` runs the task with `local-completions`
at that concurrency, and one JSON line goes to stdout with the provider's counts and the
seconds `simple_evaluate` took. Starting lm-eval once instead of once per value keeps its
start-up (tens of seconds on a loaded 2-core machine) out of the comparison of values;
api_limit.py times whole `lm_eval` processes separately, at the best value.

Standard library + lm_eval only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.request


def provider(base_url: str, method: str) -> dict:
    request = urllib.request.Request(f"{base_url}/stats", method=method)
    with urllib.request.urlopen(request, timeout=10) as r:
        return dict(json.loads(r.read()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task-dir", required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--base-url", required=True, help="the provider's /v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-retries", type=int, required=True)
    ap.add_argument("--concurrency", type=int, nargs="+", required=True)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    proto = os.fdopen(os.dup(1), "w")  # stdout carries the protocol; lm-eval's prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    tasks = TaskManager(include_path=args.task_dir)
    for n in args.concurrency:
        model_args = ",".join(
            [
                f"model={args.model}",
                f"base_url={args.base_url}/completions",
                f"num_concurrent={n}",
                f"max_retries={args.max_retries}",
                "tokenizer_backend=None",
                "tokenized_requests=False",
            ]
        )
        provider(args.base_url, "POST")
        t0 = time.monotonic()
        error = None
        try:
            simple_evaluate(
                model="local-completions",
                model_args=model_args,
                tasks=[args.task],
                task_manager=tasks,
                batch_size=1,
            )
        except Exception as exc:  # an arm that dies of 429s is a result, not the end of the sweep
            error = f"{type(exc).__name__}: {exc}"[:500]
        t1 = time.monotonic()
        print(
            json.dumps(
                {
                    "num_concurrent": n,
                    "t0": t0,
                    "t1": t1,
                    "error": error,
                    "stats": provider(args.base_url, "GET"),
                }
            ),
            file=proto,
            flush=True,
        )


if __name__ == "__main__":
    main()
