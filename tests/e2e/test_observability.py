"""Issue 7 against the real Prometheus of the stack (127.0.0.1:9090), after real runs: the
alert rules are loaded and evaluate cleanly, a dead letter fires its alert, and every panel
of every Grafana board (the generated JSON) returns data. The overview board's data is drawn
into tests/artifacts/overview-board.png (Grafana itself cannot run here).

Two boards' panels need services the stack does not run: a worker group on a model API that
answers 429s (the fake provider), and a router configured with ROUTER_FALLBACK routing a run
that opted into SLA fallback. The test starts both and has Prometheus scrape them through
the local stack's `spawned` file_sd targets (ops/prometheus/prometheus.local.yml). How it
queries Prometheus, has it scrape a service and draws the board: tests/e2e/observability_helpers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from evalstream.common import topics
from evalstream.common.messages import Shard, decode
from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import arithmetic_items, submit_wait, write_jsonl
from tests.e2e.observability_helpers import (
    finite_points,
    prom,
    scraped,
    scraped_twice,
    screenshot_overview,
    start_service,
    until,
    value,
)
from tests.e2e.router_helpers import FakeGroup, create_topic, publish_shards, router_env, shards_for
from tests.fakes.openai_provider import FakeProvider, storm
from tests.replay_files import replay_dir
from tests.support import admin_settings, read_topic_since, topic_end_offsets, unique
from tests.unit.test_boards import boards, committed

pytestmark = pytest.mark.stack

GPU_METRIC = re.compile(r"\bevalstream_gpu_[a-z_]+")
API_KEY = "sk-observability-e2e-7c1d9b3a"


@pytest.fixture(scope="module")
async def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A null-model run (pipeline only) and a replay run with wrong answers and two items
    without an answer (dead letters, failures), as a user would submit them."""
    tmp = tmp_path_factory.mktemp("observability")
    started = time.time()
    await asyncio.to_thread(prom, "/-/reload", "POST")  # rule files are read from the checkout
    null = await asyncio.to_thread(
        submit_wait,
        write_jsonl(tmp / "null.jsonl", arithmetic_items(200, "n")),
        "--model",
        "null",
        "--shard-size",
        "20",
    )
    items = arithmetic_items(40, "o")
    answers = [
        {"id": it["id"], "response": it["answer"] if i % 3 else "0"} for i, it in enumerate(items[:38])
    ]
    replay = await asyncio.to_thread(
        submit_wait,
        write_jsonl(tmp / "obs.jsonl", items),
        "--model",
        f"replay:{write_jsonl(replay_dir() / 'answers.jsonl', answers)}",
        "--shard-size",
        "10",
        "--max-attempts",
        "1",
    )
    assert null["status"] == replay["status"] == "completed" and replay["failed"] == 2
    return {"started": started, "null": null, "replay": replay}


@pytest.fixture(scope="module")
async def api_and_sla(
    runs: dict[str, Any], stack: Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    """A worker group on an `openai:` SPEC against the fake provider through a 429 storm, and
    a router with ROUTER_FALLBACK that sends a run's opted-in shards one tier down; both
    scraped by Prometheus until the module's tests are done."""
    tmp = tmp_path_factory.mktemp("api_and_sla")
    with contextlib.ExitStack() as services:
        # --- provider 429s and the adaptive concurrency
        provider = services.enter_context(FakeProvider())
        provider.rate_limit(20, retry_after=0.5)
        provider.script = storm(seconds=2.0, retry_after=0.5)  # every request refused for 2 s
        group = unique("obs-openai")
        await ensure_topics(admin_settings(), [group])
        worker_env = {
            "WORKER_GROUP": group,
            "WORKER_MODEL": "openai:*",
            "OBS_API_KEY": API_KEY,
            "WORKER_API_KEYS": f"{provider.url}/*=OBS_API_KEY",  # the operator maps the key
        }
        port = await asyncio.to_thread(
            start_service, services, "evalstream.worker", tmp / "worker.log", **worker_env
        )
        services.enter_context(scraped("worker", port))
        model = unique("obs-model")  # unique: no answer-cache hits, every item asks the provider
        run = await asyncio.to_thread(
            submit_wait,
            write_jsonl(tmp / "api.jsonl", arithmetic_items(40, unique("a"))),
            "--model", provider.spec(model, concurrency=8),
            "--worker-group", group, "--shard-size", "10", timeout=300,
        )  # fmt: skip
        assert run["status"] == "completed" and run["succeeded"] == 40, run
        refused = provider.count(429)
        assert refused > 0 and provider.count(200) == 40
        revision = f'model="{model}@{provider.url}"'  # the engine labels its metrics with it
        for outcome, expected in (("ok", 40), ("rate_limited", refused)):
            series = f'evalstream_api_requests_total{{{revision}, outcome="{outcome}"}}'
            await until(
                f"{series} == {expected}, scraped twice",
                lambda series=series, expected=expected: value(series) == expected and scraped_twice(series),
                timeout=60,
            )
        limit = value(f"evalstream_api_concurrency_limit{{{revision}}}")
        assert limit is not None and 1 <= limit <= 8

        # --- SLA fallback: every heartbeat of the big model's group violates the SLA
        big_group, small_group, inbox = unique("obs-big"), unique("obs-small"), unique("eval.shards.obs")
        await create_topic(inbox)
        big, small = f"replay:{tmp / 'big.jsonl'}", f"replay:{tmp / 'small.jsonl'}"
        async with (
            FakeGroup(big_group, big, p95_ms=60_000),
            FakeGroup(small_group, small, p95_ms=100),
        ):
            env = router_env(
                inbox,
                [big_group, small_group],
                ROUTER_FALLBACK=f"{big}={small}",
                ROUTER_SLA_P95_MS="1000",
                ROUTER_SLA_TIERS="0.5",
            )
            router_port = await asyncio.to_thread(
                start_service, services, "evalstream.router", tmp / "router.log", **env
            )
            services.enter_context(scraped("router", router_port))
            small_work = topics.work_topic(small_group)
            before = await topic_end_offsets(small_work)
            await publish_shards(inbox, shards_for(unique("run-obs"), big, 4, opt_in=True))

            async def fell_back() -> list[Shard] | None:
                records = await read_topic_since(small_work, before)
                shards = [decode(v, Shard) for _, v, _ in records]
                return shards if len(shards) == 4 else None

            deadline = time.monotonic() + 180  # a new router joins a new topic's group first
            while (shards := await fell_back()) is None:
                assert time.monotonic() < deadline, "the opted-in shards never reached the lighter group"
                await asyncio.sleep(0.5)
            assert all(s.model == big and s.served_model == small for s in shards)
            tier = f'evalstream_router_sla_fallback_tier{{model="{big}"}}'
            await until(f"{tier} == 1, scraped twice", lambda: value(tier) == 1 and scraped_twice(tier))
            # all of the big group's samples are latency violations: 0.7 x 1 + 0.3 x 0
            assert value(f'evalstream_router_sla_violation_ratio{{model="{big}"}}') == pytest.approx(0.7)
            yield {"api_model": f"{model}@{provider.url}", "fallback_model": big}


async def test_alert_rules_are_loaded_and_evaluate_cleanly(runs: dict[str, Any]) -> None:
    def loaded() -> dict[str, dict[str, Any]] | None:
        groups = {g["name"]: g for g in prom("/api/v1/rules")["groups"]}
        wanted = ("evalstream.recording", "evalstream.alerts")
        if not all(n in groups and groups[n]["lastEvaluation"][:4] != "0001" for n in wanted):
            return None
        return groups

    groups = await until("the evalstream rule groups to be evaluated", loaded, timeout=60)
    rules = [r for n in ("evalstream.recording", "evalstream.alerts") for r in groups[n]["rules"]]
    assert len([r for r in rules if r["type"] == "alerting"]) == 6
    broken = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not broken, broken


async def test_dead_letters_fire_their_alert(runs: dict[str, Any]) -> None:
    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in prom("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "EvalstreamDeadLetters"
            and a["state"] == "firing"
            and a["labels"].get("reason") == "failed"  # other tests dead-letter for other reasons
        ]

    alerts = await until("EvalstreamDeadLetters (reason failed) to fire", firing, timeout=90, every=2)
    assert alerts[0]["labels"]["severity"] == "warning", alerts


async def test_run_metrics_match_the_run(runs: dict[str, Any]) -> None:
    """The per-run series equal what the database says of the run; the stage histograms
    counted its items and shards."""
    replay = runs["replay"]
    run_id = replay["run_id"]
    await until(
        "the run's accuracy series",
        lambda: value(f'evalstream_run_accuracy_ratio{{run_id="{run_id}"}}') is not None,
    )
    assert value(f'sum(evalstream_run_items_total{{run_id="{run_id}", status="failed"}})') == 2
    assert value(f'sum(evalstream_run_items_total{{run_id="{run_id}", status="succeeded"}})') == 38
    assert value(f'max(evalstream_run_accuracy_ratio{{run_id="{run_id}"}})') == pytest.approx(
        replay["accuracy"]
    )
    assert value(f'max(evalstream_run_progress_ratio{{run_id="{run_id}"}})') == 1.0
    assert value(f'sum(evalstream_run_score_total{{run_id="{run_id}"}})') == pytest.approx(
        replay["accuracy"] * 40
    )

    def stages() -> dict[str, float] | None:
        window = f"{int(time.time() - runs['started']) + 30}s"
        counted = {
            stage: value(
                f'sum(increase(evalstream_stage_latency_seconds_count{{stage="{stage}"}}[{window}]))'
            )
            or 0.0
            for stage in ("queue_wait", "engine", "grading", "end_to_end")
        }
        # the two runs: 240 items in 14 shards (others' runs may add to these)
        done = counted["end_to_end"] >= 240 * 0.9 and counted["queue_wait"] >= 14 * 0.9
        return counted if done and counted["engine"] > 0 and counted["grading"] > 0 else None

    # each service is scraped on its own beat: wait for the worker's scrape after the runs
    await until("the stage histograms to count both runs", stages, timeout=30)


async def test_every_board_panel_returns_data_from_prometheus(
    runs: dict[str, Any], api_and_sla: dict[str, Any], tmp_path: Path
) -> None:
    run_id = runs["replay"]["run_id"]
    # The aggregator's run series and the recording rules must have been scraped / evaluated.
    await until(
        "the replay run's accuracy in Prometheus",
        lambda: prom("/api/v1/query", query=f'evalstream_run_accuracy_ratio{{run_id="{run_id}"}}')["result"],
    )
    # rate() over a counter needs two scrapes of it: the run's own counters, and the dead
    # letters its two unanswered items made (on a fresh stack, the first ones ever)
    for series in (f'evalstream_run_items_total{{run_id="{run_id}"}}', "evalstream_dead_letters_total"):
        await until(
            f"two scrapes of {series}",
            lambda series=series: prom("/api/v1/query", query=f"count_over_time({series}[30s]) >= 2")[
                "result"
            ],
        )
    for rule in (
        "evalstream:items_failed:ratio_rate5m",
        'evalstream:stage_latency_seconds:p99_5m{stage="engine"}',
    ):
        await until(
            f"{rule} to have a value",
            lambda rule=rule: [
                r for r in prom("/api/v1/query", query=rule)["result"] if math.isfinite(float(r["value"][1]))
            ],
        )
    has_gpu = bool(prom("/api/v1/query", query="evalstream_gpu_utilization_ratio")["result"])
    cpu_workers = prom("/api/v1/query", query='evalstream_cpu_utilization_ratio{service="worker"}')["result"]
    # One step past now: the recording rules may have a single sample yet, newer than the
    # last step that ends before now.
    start, end = runs["started"] - 30, time.time() + 5
    variables = {"run_id": run_id, "group": ".+"}
    empty, gpu_panels, drawn_overview = [], [], []
    for name, board in committed().items():
        for panel in board["panels"]:
            targets = panel.get("targets", [])
            if not targets:
                continue
            results = []
            for target in targets:
                expr = boards.substitute(target["expr"], variables)
                data = await asyncio.to_thread(
                    prom, "/api/v1/query_range", query=expr, start=start, end=end, step=5
                )
                results.append((target, data["result"]))
            points = sum(finite_points(r) for _, r in results)
            gpu_only = all(GPU_METRIC.search(t["expr"]) for t in targets)
            if gpu_only and not has_gpu:
                gpu_panels.append(panel["title"])  # the queries ran (status success) and found no GPU
            elif points == 0:
                empty.append(f"{name}: {panel['title']}")
            if name == "evalstream-overview.json":
                drawn_overview.append((panel, results))
    assert not empty, f"panels without data: {empty}"
    if gpu_panels:
        # Only the GPU-only panels may be empty, and only because every worker is on the CPU
        # (whose fallback gauges the "Device utilisation" and "Memory" panels showed above).
        assert gpu_panels == ["GPU temperature", "GPU power"] and cpu_workers, gpu_panels
    await asyncio.to_thread(screenshot_overview, drawn_overview, tmp_path)
