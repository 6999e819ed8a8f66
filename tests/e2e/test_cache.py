"""The answer cache end to end: a second identical run makes ZERO engine calls.

Counted twice, independently: by the fake provider (HTTP requests it received) and by the
worker's own evalstream_engine_requests_total (requests handed to any engine), on a worker
group of its own so that no other run moves either count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from evalstream.common.settings import Settings
from evalstream.common.topics_admin import ensure_topics
from tests.e2e.helpers import arithmetic_items, result_rows, submit_wait, write_jsonl
from tests.fakes.openai_provider import FakeProvider
from tests.fakes.worker_metrics import metric_total
from tests.support import admin_settings, unique

pytestmark = pytest.mark.stack

ITEMS = 40


async def test_second_identical_run_makes_zero_engine_calls(
    stack: Settings, pg: asyncpg.Connection, spawn: Any, tmp_path: Path
) -> None:
    group = unique("cache")
    await ensure_topics(admin_settings(), [group])
    dataset = write_jsonl(tmp_path / "cache.jsonl", arithmetic_items(ITEMS, prefix=unique("k")))
    with FakeProvider() as provider:
        worker, port = spawn("evalstream.worker", WORKER_GROUP=group, WORKER_MODEL="openai:*")
        await asyncio.to_thread(worker.wait_healthy, port)
        spec = provider.spec("cache-model")

        def run(*extra: str) -> tuple[dict[str, Any], int, float]:
            summary = submit_wait(dataset, "--model", spec, "--worker-group", group, *extra, timeout=180)
            return (
                summary,
                provider.count(),
                metric_total(port, "evalstream_engine_requests_total", model=spec),
            )

        first, calls_1, engine_1 = await asyncio.to_thread(run)
        second, calls_2, engine_2 = await asyncio.to_thread(run)
        # the counts do see calls: other generation parameters are another cache key
        third, calls_3, engine_3 = await asyncio.to_thread(run, "--max-tokens", "99")
    assert (calls_1, engine_1) == (ITEMS, ITEMS) and first["cache_hits"] == 0
    assert (calls_2, engine_2) == (ITEMS, ITEMS), "the identical run called the engine"
    assert second["cache_hits"] == second["succeeded"] == ITEMS
    assert (calls_3, engine_3) == (2 * ITEMS, 2 * ITEMS) and third["cache_hits"] == 0
    rows_1, rows_2 = await result_rows(pg, first["run_id"]), await result_rows(pg, second["run_id"])
    assert [r["response"] for r in rows_2] == [r["response"] for r in rows_1]
    assert all(r["cache_hit"] for r in rows_2) and not any(r["cache_hit"] for r in rows_1)
    assert second["accuracy"] == first["accuracy"] == 1.0
