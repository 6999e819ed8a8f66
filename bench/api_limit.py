"""9. API-backed runs at the provider's limit: the pipeline vs lm-eval's `local-completions`,
on the same questions and the same rate-limited OpenAI-compatible provider.

The provider is tests/fakes/limited_provider.py in a process of its own (a stand-in for
DeepSeek or a gateway; users never run it): token buckets at the seed's DeepSeek preset
limits by default, 10 requests/s and 1,000/min (libs/common/evalstream/common/providers.py;
`--scale` multiplies both, for a shorter run), lognormal latency (median 0.5 s, sigma 0.4:
about 0.26–0.97 s for 90 % of requests) plus 2 ms per completion token, 429 with
Retry-After, retry-after-ms and x-ratelimit-* headers. Every arm starts on full buckets.

* **Pipeline**: `evalctl submit DATA --model openai:fake-model@http://127.0.0.1:<port>/v1
  --grader exact --max-tokens 16 --wait --json`, a process timed from start to exit, on the
  bench stack, its worker restarted with WORKER_MODEL allowing exactly that URL and
  WORKER_API_KEYS mapping it to a variable of its own (a SPEC never carries a key). The SPEC
  has no rate options: the engine learns the limits from the provider's headers
  (worker/engines/openai.py). The answer cache is emptied before each run.
* **lm-eval**: `lm_eval --model local-completions` (same prompt text, greedy, 16 tokens,
  exact match; tokenizer_backend=None, so nothing is downloaded) from bench/.venv-lmeval
  (created as against_lmeval.py does, plus lm-eval's `[api]` extra), a process timed from
  start to exit. `max_retries` is raised from its default 3 to 10, so that no arm dies of
  429s (generous to lm-eval). Its `num_concurrent` is swept (1–8, 16, 32) on a
  smaller set, in one lm-eval process (bench/lmeval/api_sweep.py: start-up paid once, each
  value timed around its `simple_evaluate`); the fastest is lm-eval's best.

Then each repeat runs both on fresh questions (same ones for both), alternating which goes
first. Per arm: wall time, the provider's counts (requests, 429s, admissions), the share of
the provider's capacity used while the arm was at it (admitted ÷ (burst + rate × span), span
from first to last admission), and items/s end to end ÷ the limit. Goals: capacity share ≥
0.95 with < 1 % of requests answered 429, and lm-eval's wall time ÷ the pipeline's ≥ 2.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.against_lmeval import LMEVAL_VERSION, VENV, ensure_lmeval_venv
from bench.harness import benchstack, data, inprocess, paths, pure, recording

NAME = "api_limit"
MODEL = "fake-model"
KEY_VARIABLE = "BENCH_PROVIDER_API_KEY"  # the worker's key for the fake provider (not checked by it)
PROVIDER_PORT_BASE = 8390  # + the stack's port offset
TASK = "evalstream_api_qa"
MAX_TOKENS = 16
GOAL_SHARE, GOAL_429, GOAL_SPEEDUP = 0.95, 0.01, 2.0
LMEVAL_MAX_RETRIES = 10
SWEEP = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]


# ----------------------------------------------------------------------------- the provider


class Provider:
    """tests/fakes/limited_provider.py as a process on 127.0.0.1:<port>."""

    def __init__(self, port: int, rps: float, rpm: float) -> None:
        self.port, self.rps, self.rpm = port, rps, rpm
        self.url = f"http://127.0.0.1:{port}/v1"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise SystemExit(f"port {port} is taken: another provider left running?")
        (benchstack.stack_dir() / "logs").mkdir(parents=True, exist_ok=True)
        self.log = (benchstack.stack_dir() / "logs" / "bench-provider.log").open("a")
        self.proc = subprocess.Popen(
            [
                str(paths.PY),
                "-m",
                "tests.fakes.limited_provider",
                "--port",
                str(port),
                "--rps",
                str(rps),
                "--rpm",
                str(rpm),
            ],
            cwd=paths.ROOT,
            stdout=self.log,
            stderr=self.log,
        )
        benchstack.wait_http(f"{self.url}/models", timeout=60)

    def reset(self) -> None:
        """Counts cleared, buckets full."""
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/stats", method="POST"), timeout=5).read()

    def stats(self) -> dict[str, Any]:
        return dict(json.loads(benchstack.http_get(f"{self.url}/stats")))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def usage(
    stats: dict[str, Any], items: int, t0: float, t1: float, rps: float, burst: float
) -> dict[str, Any]:
    """How much of the provider's limit an arm that ran from `t0` to `t1` (time.monotonic,
    the provider's clock too) used, from the provider's own counts."""
    admitted, requests = stats["admitted_prompts"], stats["requests"]
    span = (stats["last_admitted"] - stats["first_admitted"]) if admitted else 0.0
    wall_s = t1 - t0
    return {
        "wall_s": round(wall_s, 2),
        # process start -> first request admitted; last admitted -> process exit
        "before_first_s": round(stats["first_admitted"] - t0, 2) if admitted else None,
        "after_last_s": round(t1 - stats["last_admitted"], 2) if admitted else None,
        "items": items,
        "requests": requests,
        "rate_limited": stats["rate_limited"],
        "share_429": round(stats["rate_limited"] / requests, 4) if requests else None,
        "admitted": admitted,
        "admitted_span_s": round(span, 2),
        # what the provider admits at most in `span`: its burst, then its sustained rate
        "capacity_share": round(admitted / (burst + rps * span), 4) if admitted else None,
        "items_per_s": round(items / wall_s, 3),
        "end_to_end_share": round(items / wall_s / rps, 4),
        "max_in_flight": stats["max_in_flight"],
    }


# ----------------------------------------------------------------------------- the two arms


def pipeline_arm(provider: Provider, dataset: Path, items: int, name: str, burst: float) -> dict[str, Any]:
    inprocess.clear_answer_cache()
    provider.reset()
    cmd = [
        str(paths.ROOT / ".venv" / "bin" / "evalctl"),
        "submit",
        str(dataset),
        "--model",
        f"openai:{MODEL}@{provider.url}",
        "--grader",
        "exact",
        "--max-tokens",
        str(MAX_TOKENS),
        "--name",
        name,
        "--wait",
        "--json",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=paths.ROOT, capture_output=True, text=True, timeout=3600)
    t1 = time.monotonic()
    if proc.returncode != 0:
        raise RuntimeError(f"evalctl submit failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    out = usage(provider.stats(), items, t0, t1, provider.rps, burst)
    out.update(
        run_id=summary.get("run_id"),
        succeeded=summary.get("succeeded"),
        failed=summary.get("failed"),
        accuracy=summary.get("accuracy"),
    )
    return out


def ensure_api_extra() -> None:
    """lm-eval's `[api]` extra (aiohttp, tenacity, requests, tqdm) in bench/.venv-lmeval."""
    py = VENV / "bin" / "python"
    check = [str(py), "-c", "import aiohttp, tenacity, requests, tqdm"]
    if subprocess.run(check, capture_output=True).returncode == 0:
        return
    recording.log(f"adding lm-eval[api]=={LMEVAL_VERSION} to {VENV}")
    paths.pip_install(py, f"lm-eval[api]=={LMEVAL_VERSION}")


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


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument(
        "--scale", type=float, default=None, help="multiply the provider's limits (default 1: the seed's)"
    )
    args = ap.parse_args()
    started = time.monotonic()
    from evalstream.common.providers import PRESETS

    seed = PRESETS["deepseek"]
    scale = args.scale or (4.0 if args.quick else 1.0)
    rps, rpm = seed.rps * scale, seed.rpm * scale
    sustained = min(rps, rpm / 60)
    burst = rps  # the per-second bucket's capacity: what a full provider admits at once
    items, sweep_items, repeats, sweep = (80, 40, 1, [2, 8]) if args.quick else (600, 120, 3, SWEEP)

    benchstack.use_bench_stack()
    port = PROVIDER_PORT_BASE + benchstack.offset()
    venv = ensure_lmeval_venv()
    ensure_api_extra()
    url = f"http://127.0.0.1:{port}/v1"
    worker_env = {
        "WORKER_MODEL": f"openai:{MODEL}@{url}",
        "WORKER_API_KEYS": f"{url}/*={KEY_VARIABLE}",
        KEY_VARIABLE: "bench-not-a-secret",
    }
    if scale != 1.0:  # the default 8 in flight covers the seed's 10/s at these latencies; more for more
        worker_env["OPENAI_CONCURRENCY"] = str(min(64, math.ceil(8 * scale)))
    benchstack.ensure_up(worker_env)
    provider = Provider(port, rps, rpm)
    try:
        work = data.data_dir() / NAME
        shutil.rmtree(work, ignore_errors=True)
        recording.log(f"provider {provider.url}: {rps:g} requests/s, {rpm:g}/min (seed ×{scale:g})")

        # lm-eval's best num_concurrent, on a smaller set
        sweep_rows = data.arithmetic_rows(sweep_items, seed=900, prefix="s-")
        sweep_task = write_task(work / "sweep", data.write_jsonl(work / "sweep.jsonl", sweep_rows))
        sweep_out = lmeval_sweep(provider, sweep_task, sweep_items, sweep, burst)
        # fastest first; a value whose whole run dies of 429s (lm-eval gives up after
        # max_retries refusals of one request) makes way for the next, as a user would
        ranked = [
            r["num_concurrent"] for r in sorted(sweep_out, key=lambda r: r["wall_s"]) if r["error"] is None
        ]
        if not ranked:
            raise RuntimeError("no num_concurrent value finished lm-eval's sweep")
        best = ranked[0]
        lmeval_failed: list[dict[str, Any]] = []

        reps: list[dict[str, Any]] = []
        for r in range(repeats):
            rows = data.arithmetic_rows(items, seed=910 + r, prefix=f"a{r}-")
            dataset = data.write_jsonl(work / f"rep{r}.jsonl", rows)
            task = write_task(work / f"rep{r}", dataset)
            arms: dict[str, dict[str, Any]] = {}
            order = ["pipeline", "lmeval"] if r % 2 == 0 else ["lmeval", "pipeline"]
            for arm in order:
                if arm == "pipeline":
                    arms[arm] = pipeline_arm(provider, dataset, items, f"bench-api-{r}", burst)
                else:
                    while True:
                        arms[arm] = lmeval_arm(provider, task, items, best, burst)
                        if arms[arm]["rc"] == 0 or best == ranked[-1]:
                            break
                        recording.log(
                            f"lm-eval num_concurrent={best} died after {arms[arm]['wall_s']} s "
                            f"({arms[arm]['rate_limited']} 429s); next: {ranked[ranked.index(best) + 1]}"
                        )
                        lmeval_failed.append({**arms[arm], "repeat": r})
                        best = ranked[ranked.index(best) + 1]
            p, le = arms["pipeline"], arms["lmeval"]
            if le["rc"] != 0:
                raise RuntimeError("lm-eval failed at every num_concurrent value the sweep finished")
            speedup = le["wall_s"] / p["wall_s"]
            recording.log(
                f"repeat {r}: pipeline {p['wall_s']} s (capacity share {p['capacity_share']}, 429 "
                f"{p['rate_limited']}/{p['requests']}), lm-eval(n={best}) {le['wall_s']} s (share "
                f"{le['capacity_share']}, 429 {le['rate_limited']}/{le['requests']}) -> {speedup:.2f}x"
            )
            reps.append({**arms, "speedup": round(speedup, 3), "order": order})
    finally:
        provider.close()
        benchstack.ensure_up()  # the default worker back for the other benchmarks

    def med(arm: str, key: str) -> float | None:
        return pure.summarize([x[arm][key] for x in reps if x[arm].get(key) is not None])["median"]

    share, share_429 = med("pipeline", "capacity_share"), med("pipeline", "share_429")
    speed = pure.summarize([x["speedup"] for x in reps])
    met_limit = share is not None and share >= GOAL_SHARE and share_429 is not None and share_429 < GOAL_429
    met_speed = speed["median"] is not None and speed["median"] >= GOAL_SPEEDUP
    lm_share = med("lmeval", "capacity_share")
    diagnosis = []
    if not met_speed:
        diagnosis.append(
            f"api_limit: lm-eval at its best num_concurrent ({best}) already used {pure.fmt_num(lm_share)} of the "
            f"provider's capacity while it ran (pipeline {pure.fmt_num(share)}); both are held to the same "
            f"{sustained:g} requests/s, so the pipeline can be at most 1 ÷ {pure.fmt_num(lm_share)} = "
            f"{pure.fmt_num(1 / lm_share if lm_share else None)}× faster at the provider, plus what lm-eval "
            f"spends starting up: {pure.fmt_num(med('lmeval', 'before_first_s'))} s from its start to its first "
            f"request (the pipeline: {pure.fmt_num(med('pipeline', 'before_first_s'))} s) on this shared machine."
        )
    recording.write_result(
        NAME,
        {
            "params": {
                "provider": {
                    "rps": rps,
                    "rpm": rpm,
                    "scale_of_seed": scale,
                    "latency_median_s": 0.5,
                    "latency_sigma": 0.4,
                    "per_token_s": 0.002,
                },
                "items": items,
                "sweep_items": sweep_items,
                "repeats": repeats,
                "max_tokens": MAX_TOKENS,
                "spec": f"openai:{MODEL}@http://127.0.0.1:<port>/v1 (no options)",
                "lmeval": {
                    "version": LMEVAL_VERSION,
                    "model": "local-completions",
                    "max_retries": LMEVAL_MAX_RETRIES,
                    "sweep": sweep,
                    "venv": venv,
                },
            },
            # HEAD of the checkout (recording.machine() reads .git as a folder, which a
            # worktree's is not)
            "commit": subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=paths.ROOT, capture_output=True, text=True
            ).stdout.strip()
            or None,
            "lmeval_sweep": sweep_out,
            "lmeval_best_num_concurrent": best,
            "lmeval_sweep_ranking": ranked,
            "lmeval_failed_runs": lmeval_failed,
            "repeats": reps,
            "pipeline": {
                k: med("pipeline", k) for k in ("wall_s", "capacity_share", "share_429", "end_to_end_share")
            },
            "lmeval": {
                k: med("lmeval", k) for k in ("wall_s", "capacity_share", "share_429", "end_to_end_share")
            },
            "speedup": speed,
            "diagnosis": diagnosis,
            "goals": [
                pure.goal_row(
                    "9a",
                    "API at the provider's limit (pipeline: share of the provider's capacity used; 429 share)",
                    f"≥ {GOAL_SHARE} with < {GOAL_429:.0%} 429",
                    f"{pure.fmt_num(share)} with {pure.fmt_num((share_429 or 0) * 100)} % 429 (median of {len(reps)}); "
                    f"end to end {pure.fmt_num(med('pipeline', 'end_to_end_share'))} of the limit",
                    met_limit,
                    f"{items} items at {rps:g}/s and {rpm:g}/min (seed ×{scale:g}), lognormal latency median 0.5 s; "
                    "bare SPEC, limits learned from x-ratelimit-* headers",
                ),
                pure.goal_row(
                    "9b",
                    "API runs vs lm-eval local-completions at its best num_concurrent (wall time ratio)",
                    f"≥ {GOAL_SPEEDUP:g}×",
                    f"{pure.fmt_num(speed['median'])}× (median of {speed['n']}; "
                    f"{pure.fmt_num(speed['min'])}–{pure.fmt_num(speed['max'])})",
                    met_speed,
                    f"lm-eval {LMEVAL_VERSION} num_concurrent={best} of {sweep}"
                    + (
                        f" ({', '.join(sorted({str(f['num_concurrent']) for f in lmeval_failed}))} died of 429s "
                        f"on {items} items)"
                        if lmeval_failed
                        else ""
                    )
                    + ": "
                    f"{pure.fmt_num(med('lmeval', 'wall_s'))} s, capacity share {pure.fmt_num(lm_share)}, "
                    f"429 {pure.fmt_num((med('lmeval', 'share_429') or 0) * 100)} %; pipeline "
                    f"{pure.fmt_num(med('pipeline', 'wall_s'))} s",
                ),
            ],
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
