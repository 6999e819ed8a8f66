"""The `openai:` engine end to end: a worker group of its own serving `openai:*` against the
fake provider, through a 429 storm. The run is slower, and nothing is lost or duplicated."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import arithmetic_items, evalctl, result_rows, submit_wait, write_jsonl
from tests.fakes.openai_provider import FakeProvider, storm
from tests.fakes.worker_metrics import metric_total
from tests.support import admin_settings, unique

pytestmark = pytest.mark.stack

SECRET = "sk-storm-e2e-5f2c9a7d1b3e4c6a"
ITEMS = 100


async def test_429_storm_slows_the_run_but_loses_and_duplicates_nothing(
    stack: Settings, pg: asyncpg.Connection, spawn: Any, tmp_path: Path
) -> None:
    group = unique("openai")
    await ensure_topics(admin_settings(), [group])
    items = arithmetic_items(ITEMS, prefix=unique("s"))
    with FakeProvider() as provider:
        worker, port = spawn(
            "evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="openai:*", STORM_API_KEY=SECRET,
            WORKER_API_KEYS=f"{provider.url}/*=STORM_API_KEY",  # the operator maps the key to the endpoint
        )  # fmt: skip
        await asyncio.to_thread(worker.wait_healthy, port)

        def run(model: str, name: str) -> tuple[dict[str, Any], float]:
            started = time.monotonic()
            spec = provider.spec(model, concurrency=8)
            summary = submit_wait(
                write_jsonl(tmp_path / f"{name}.jsonl", items), "--model", spec, "--worker-group", group,
                "--shard-size", "10", timeout=240,
            )  # fmt: skip
            return summary, time.monotonic() - started

        # the baseline: same items, another model name (so no answer-cache hits), no storm
        calm, calm_s = await asyncio.to_thread(run, "calm-model", "calm")
        assert calm["succeeded"] == ITEMS and provider.count(429) == 0
        provider.requests.clear()
        # a real API's manners: at most 20 requests per second; and a storm: for the first
        # 3 seconds every request is refused, with Retry-After: 1
        provider.rate_limit(20, retry_after=1.0)
        provider.script = storm(seconds=3.0, retry_after=1.0)
        summary, elapsed = await asyncio.to_thread(run, "storm-model", "storm")
        refused, answered = provider.count(429), provider.count(200)
        storm_model = f"storm-model@{provider.url}"  # the engine's revision labels its metrics
        retries = metric_total(port, "evalstream_api_retries_total", model=storm_model, reason="rate_limited")
        limit = metric_total(port, "evalstream_api_concurrency_limit", model=storm_model)
    rows = await result_rows(pg, summary["run_id"])
    # nothing lost, nothing duplicated, everything right
    assert summary["status"] == "completed" and summary["total"] == summary["recorded"] == ITEMS
    assert sorted(r["item_id"] for r in rows) == sorted(i["id"] for i in items)
    assert [r["error"] for r in rows] == [None] * ITEMS
    assert summary["accuracy"] == 1.0
    assert answered == ITEMS  # each item answered by the provider exactly once
    # the key the operator mapped to this endpoint went with every request
    assert {r.headers.get("Authorization") for r in provider.requests} == {f"Bearer {SECRET}"}
    # slower: the storm was ridden out by waiting, not by losing items
    # the engine's first request goes alone (refused), then rounds of 4 and 2 as the
    # concurrency limit halves on each round of refusals, one Retry-After apart
    assert refused >= 5 and retries >= refused - 8  # (the last round's refusals may be in flight)
    assert elapsed >= 3.0 and elapsed > calm_s + 2.0
    assert 1 <= limit <= 8
    # usage recorded from the provider's `usage`
    assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] == 1 for r in rows)
    status = evalctl("status", summary["run_id"], "--json").stdout
    assert '"failed": 0' in status
    log_text = worker.log.read_text()
    assert SECRET not in log_text and SECRET not in status
    print(
        f"429 storm: {ITEMS} items in {elapsed:.1f}s (without: {calm_s:.1f}s), {refused} refusals, {int(retries)} engine retries, "
        f"{summary['retried']} pipeline retries, concurrency limit after: {limit:g}"
    )
