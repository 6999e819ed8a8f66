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

import argparse
import contextlib
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import benchstack, data, inprocess, paths, pure, recording
from bench.harness.lmeval_api import (
    LMEVAL_MAX_RETRIES,
    MAX_TOKENS,
    MODEL,
    lmeval_arm,
    lmeval_sweep,
    write_task,
)
from bench.harness.provider import Provider, usage
from bench.harness.venvs import LMEVAL_VERSION, ensure_api_extra, ensure_lmeval_venv

NAME = "api_limit"
KEY_VARIABLE = "BENCH_PROVIDER_API_KEY"  # the worker's key for the fake provider (not checked by it)
PROVIDER_PORT_BASE = 8390  # + the stack's port offset
GOAL_SHARE, GOAL_429, GOAL_SPEEDUP = 0.95, 0.01, 2.0
SWEEP = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]


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


# ----------------------------------------------------------------------------- main


@dataclass
class Plan:
    """The provider's limits and the sizes of the runs."""

    scale: float
    rps: float
    rpm: float
    items: int
    sweep_items: int
    repeats: int
    sweep: list[int]

    @property
    def sustained(self) -> float:
        return min(self.rps, self.rpm / 60)

    @property
    def burst(self) -> float:
        return self.rps  # the per-second bucket's capacity: what a full provider admits at once


def plan(args: argparse.Namespace) -> Plan:
    from evalstream.common.providers import PRESETS

    seed = PRESETS["deepseek"]
    scale = args.scale or (4.0 if args.quick else 1.0)
    items, sweep_items, repeats, sweep = (80, 40, 1, [2, 8]) if args.quick else (600, 120, 3, SWEEP)
    return Plan(scale, seed.rps * scale, seed.rpm * scale, items, sweep_items, repeats, sweep)


def start_worker(url: str, scale: float) -> None:
    """The bench stack's worker allowed exactly the provider's URL, with a key of its own."""
    worker_env = {
        "WORKER_MODEL": f"openai:{MODEL}@{url}",
        "WORKER_API_KEYS": f"{url}/*={KEY_VARIABLE}",
        KEY_VARIABLE: "bench-not-a-secret",
    }
    if scale != 1.0:  # the default 8 in flight covers the seed's 10/s at these latencies; more for more
        worker_env["OPENAI_CONCURRENCY"] = str(min(64, math.ceil(8 * scale)))
    benchstack.ensure_up(worker_env)


def rank_lmeval(provider: Provider, work: Path, p: Plan) -> tuple[list[dict[str, Any]], list[int]]:
    """lm-eval's sweep on a smaller set, and its num_concurrent values fastest first; a value
    whose whole run dies of 429s (lm-eval gives up after max_retries refusals of one request)
    makes way for the next, as a user would."""
    sweep_rows = data.arithmetic_rows(p.sweep_items, seed=900, prefix="s-")
    sweep_task = write_task(work / "sweep", data.write_jsonl(work / "sweep.jsonl", sweep_rows))
    sweep_out = lmeval_sweep(provider, sweep_task, p.sweep_items, p.sweep, p.burst)
    ranked = [r["num_concurrent"] for r in sorted(sweep_out, key=lambda r: r["wall_s"]) if r["error"] is None]
    if not ranked:
        raise RuntimeError("no num_concurrent value finished lm-eval's sweep")
    return sweep_out, ranked


def run_repeats(
    provider: Provider, work: Path, p: Plan, ranked: list[int]
) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
    """Both arms per repeat on fresh questions, alternating which goes first; the repeats,
    lm-eval's num_concurrent at the end and its runs that died of 429s."""
    best = ranked[0]
    lmeval_failed: list[dict[str, Any]] = []
    reps: list[dict[str, Any]] = []
    for r in range(p.repeats):
        rows = data.arithmetic_rows(p.items, seed=910 + r, prefix=f"a{r}-")
        dataset = data.write_jsonl(work / f"rep{r}.jsonl", rows)
        task = write_task(work / f"rep{r}", dataset)
        arms: dict[str, dict[str, Any]] = {}
        order = ["pipeline", "lmeval"] if r % 2 == 0 else ["lmeval", "pipeline"]
        for arm in order:
            if arm == "pipeline":
                arms[arm] = pipeline_arm(provider, dataset, p.items, f"bench-api-{r}", p.burst)
            else:
                while True:
                    arms[arm] = lmeval_arm(provider, task, p.items, best, p.burst)
                    if arms[arm]["rc"] == 0 or best == ranked[-1]:
                        break
                    recording.log(
                        f"lm-eval num_concurrent={best} died after {arms[arm]['wall_s']} s "
                        f"({arms[arm]['rate_limited']} 429s); next: {ranked[ranked.index(best) + 1]}"
                    )
                    lmeval_failed.append({**arms[arm], "repeat": r})
                    best = ranked[ranked.index(best) + 1]
        pa, le = arms["pipeline"], arms["lmeval"]
        if le["rc"] != 0:
            raise RuntimeError("lm-eval failed at every num_concurrent value the sweep finished")
        speedup = le["wall_s"] / pa["wall_s"]
        recording.log(
            f"repeat {r}: pipeline {pa['wall_s']} s (capacity share {pa['capacity_share']}, 429 "
            f"{pa['rate_limited']}/{pa['requests']}), lm-eval(n={best}) {le['wall_s']} s (share "
            f"{le['capacity_share']}, 429 {le['rate_limited']}/{le['requests']}) -> {speedup:.2f}x"
        )
        reps.append({**arms, "speedup": round(speedup, 3), "order": order})
    return reps, best, lmeval_failed


def verdict(
    reps: list[dict[str, Any]], p: Plan, best: int, lmeval_failed: list[dict[str, Any]]
) -> dict[str, Any]:
    """The medians of both arms, the speedup, the goals and, where the speed goal is missed,
    why."""

    def med(arm: str, key: str) -> float | None:
        return pure.summarize([x[arm][key] for x in reps if x[arm].get(key) is not None])["median"]

    share, share_429 = med("pipeline", "capacity_share"), med("pipeline", "share_429")
    speed = pure.summarize([x["speedup"] for x in reps])
    met_limit = share is not None and share >= GOAL_SHARE and share_429 is not None and share_429 < GOAL_429
    met_speed = speed["median"] is not None and speed["median"] >= GOAL_SPEEDUP
    lm_share = med("lmeval", "capacity_share")
    fmt = pure.fmt_num
    diagnosis = []
    if not met_speed:
        diagnosis.append(
            f"api_limit: lm-eval at its best num_concurrent ({best}) already used {fmt(lm_share)} of the "
            f"provider's capacity while it ran (pipeline {fmt(share)}); both are held to the same "
            f"{p.sustained:g} requests/s, so the pipeline can be at most 1 ÷ {fmt(lm_share)} = "
            f"{fmt(1 / lm_share if lm_share else None)}× faster at the provider, plus what lm-eval "
            f"spends starting up: {fmt(med('lmeval', 'before_first_s'))} s from its start to its first "
            f"request (the pipeline: {fmt(med('pipeline', 'before_first_s'))} s) on this shared machine."
        )
    died = sorted({str(f["num_concurrent"]) for f in lmeval_failed})
    keys = ("wall_s", "capacity_share", "share_429", "end_to_end_share")
    return {
        "pipeline": {k: med("pipeline", k) for k in keys},
        "lmeval": {k: med("lmeval", k) for k in keys},
        "speedup": speed,
        "diagnosis": diagnosis,
        "goals": [
            pure.goal_row(
                "9a",
                "API at the provider's limit (pipeline: share of the provider's capacity used; 429 share)",
                f"≥ {GOAL_SHARE} with < {GOAL_429:.0%} 429",
                f"{fmt(share)} with {fmt((share_429 or 0) * 100)} % 429 (median of {len(reps)}); "
                f"end to end {fmt(med('pipeline', 'end_to_end_share'))} of the limit",
                met_limit,
                f"{p.items} items at {p.rps:g}/s and {p.rpm:g}/min (seed ×{p.scale:g}), lognormal latency "
                "median 0.5 s; bare SPEC, limits learned from x-ratelimit-* headers",
            ),
            pure.goal_row(
                "9b",
                "API runs vs lm-eval local-completions at its best num_concurrent (wall time ratio)",
                f"≥ {GOAL_SPEEDUP:g}×",
                f"{fmt(speed['median'])}× (median of {speed['n']}; {fmt(speed['min'])}–{fmt(speed['max'])})",
                met_speed,
                f"lm-eval {LMEVAL_VERSION} num_concurrent={best} of {p.sweep}"
                + (f" ({', '.join(died)} died of 429s on {p.items} items)" if lmeval_failed else "")
                + ": "
                f"{fmt(med('lmeval', 'wall_s'))} s, capacity share {fmt(lm_share)}, "
                f"429 {fmt((med('lmeval', 'share_429') or 0) * 100)} %; pipeline "
                f"{fmt(med('pipeline', 'wall_s'))} s",
            ),
        ],
    }


def main() -> None:
    ap = recording.arg_parser(__doc__)
    ap.add_argument(
        "--scale", type=float, default=None, help="multiply the provider's limits (default 1: the seed's)"
    )
    args = ap.parse_args()
    started = time.monotonic()
    p = plan(args)
    benchstack.use_bench_stack()
    port = PROVIDER_PORT_BASE + benchstack.offset()
    venv = ensure_lmeval_venv()
    ensure_api_extra()
    start_worker(f"http://127.0.0.1:{port}/v1", p.scale)
    provider = Provider(port, p.rps, p.rpm)
    try:
        work = data.data_dir() / NAME
        shutil.rmtree(work, ignore_errors=True)
        recording.log(f"provider {provider.url}: {p.rps:g} requests/s, {p.rpm:g}/min (seed ×{p.scale:g})")
        sweep_out, ranked = rank_lmeval(provider, work, p)
        reps, best, lmeval_failed = run_repeats(provider, work, p, ranked)
    finally:
        provider.close()
        benchstack.ensure_up()  # the default worker back for the other benchmarks
    outcome = verdict(reps, p, best, lmeval_failed)
    recording.write_result(
        NAME,
        {
            "params": {
                "provider": {
                    "rps": p.rps,
                    "rpm": p.rpm,
                    "scale_of_seed": p.scale,
                    "latency_median_s": 0.5,
                    "latency_sigma": 0.4,
                    "per_token_s": 0.002,
                },
                "items": p.items,
                "sweep_items": p.sweep_items,
                "repeats": p.repeats,
                "max_tokens": MAX_TOKENS,
                "spec": f"openai:{MODEL}@http://127.0.0.1:<port>/v1 (no options)",
                "lmeval": {
                    "version": LMEVAL_VERSION,
                    "model": "local-completions",
                    "max_retries": LMEVAL_MAX_RETRIES,
                    "sweep": p.sweep,
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
            **outcome,
        },
        started=started,
        quick=args.quick,
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
