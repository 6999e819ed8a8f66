"""A run's completion once every item has its row (decided by the sink under its lock:
status and summary), then its report.json and report.html; and the metrics of what each
window added."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minio import Minio

from evalstream.aggregator import objects
from evalstream.aggregator.store import ResultStore, Written
from evalstream.common import storage
from evalstream.common.analysis import report_html
from evalstream.common.messages import ItemResult
from evalstream.common.metrics import (
    ITEMS,
    RUN_ACCURACY,
    RUN_ITEMS,
    RUN_PROGRESS,
    RUN_SCORE,
    RUNS,
    STAGE_LATENCY,
    forget_run,
)

log = logging.getLogger("evalstream.aggregator")
# Run-labelled series live this long after their run completed (boards show the finished
# run), then go: run ids are unbounded.
RUN_SERIES_TTL_S = 15 * 60


@dataclass(frozen=True)
class Recorded:
    """What one write changed, as the metrics count it: rows, not deliveries, so that a
    redelivered batch is not counted twice."""

    results: list[ItemResult]  # the results whose rows the write made, once per item
    replaced: set[tuple[str, str]]  # of those, successes that replaced a recorded failure


def written_results(results: list[ItemResult], written: Mapping[tuple[str, str], Written]) -> Recorded:
    """`results` as `store.write` recorded them (`written`: the rows it made), once per item
    (a success over a failure)."""
    by_item = {
        (r.run_id, r.item_id): r
        for r in sorted(results, key=lambda r: r.error is None)
        if (r.run_id, r.item_id) in written
    }
    replaced = {key for key, w in written.items() if not w.inserted and by_item[key].error is None}
    return Recorded(list(by_item.values()), replaced)


class Completion:
    def __init__(self, store: ResultStore, s3: Minio, bucket: str) -> None:
        self.store = store
        self.s3 = s3
        self.bucket = bucket

    async def complete_if_done(self, run_id: str, mirrored: int) -> tuple[bool, dict[str, Any]] | None:
        """Marks the run completed when every item has its row in the database and its
        mirror: `mirrored` is the run's count of rows known mirrored (sink.py: the count read
        inside the window's own transaction, whatever aggregator wrote them). Returns
        (whether this call completed it, the summary), or None while items are missing."""
        status, total, done = await self.store.progress(run_id)
        if total:
            RUN_PROGRESS.labels(run_id=run_id).set(done / total)
        # Every item has its row, so every shard was published, even if the producer has not
        # yet marked the run running (fast runs can finish before it does).
        # `done` is read now and may hold another window's rows not yet mirrored; `mirrored`
        # never exceeds it (a run's count only grows), so it alone decides.
        if status == "rejected" or total is None or mirrored < total:
            return None
        return await self.store.complete(run_id)

    async def finish(self, run_id: str, first: bool, summary: dict[str, Any]) -> None:
        """The reports of a completed run (rewritten whenever a window touches it again, so a
        crash before they were written costs nothing)."""
        await asyncio.to_thread(objects.write_report, self.s3, self.bucket, run_id, summary)
        await self.save_report_html(run_id, summary)
        RUN_ACCURACY.labels(run_id=run_id).set(summary["accuracy"] or 0.0)
        if first:
            asyncio.get_running_loop().call_later(RUN_SERIES_TTL_S, forget_run, run_id)
            RUNS.labels(outcome="completed").inc()
            log.info("run %s completed: %d items, accuracy %s", run_id, summary["total"], summary["accuracy"])

    async def save_report_html(self, run_id: str, summary: dict[str, Any]) -> None:
        """The HTML report beside report.json. Derived data: a failure here is logged, never
        allowed to hold up the batch (the page is also rendered on demand over HTTP)."""
        try:
            page = report_html.render(await report_html.collect(self.store.pool, run_id, summary))
            await asyncio.to_thread(
                storage.put_bytes,
                self.s3,
                self.bucket,
                report_html.object_name(run_id),
                page.encode(),
                "text/html; charset=utf-8",
            )
        except Exception:
            log.exception("run %s: HTML report not saved to S3", run_id)

    async def observe(self, recorded: Recorded) -> None:
        """Metrics of recorded results: final item outcomes, per-run counts and score, and
        each item's end-to-end latency (its run was created -> its result is recorded).
        A success that replaced a recorded failure (after a redrive) moves its item from
        the run's failed count to its succeeded one: the per-run counts stay the rows."""
        per_run: dict[str, list[float]] = {}
        for r in recorded.results:
            counts = per_run.setdefault(r.run_id, [0, 0, 0.0, 0])  # succeeded, failed, score, replaced
            counts[1 if r.error is not None else 0] += 1
            counts[2] += r.score
            counts[3] += (r.run_id, r.item_id) in recorded.replaced
        failed = sum(c[1] for c in per_run.values())
        ITEMS.labels(service="aggregator", status="succeeded").inc(len(recorded.results) - failed)
        ITEMS.labels(service="aggregator", status="failed").inc(failed)
        created = await self.store.runs_created(set(per_run))
        now = time.time()
        e2e = STAGE_LATENCY.labels(stage="end_to_end")
        for run_id, (ok, bad, score, replaced) in per_run.items():
            RUN_ITEMS.labels(run_id=run_id, status="succeeded").inc(ok)
            RUN_ITEMS.labels(run_id=run_id, status="failed").inc(bad - replaced)
            RUN_SCORE.labels(run_id=run_id).inc(score)
            if run_id in created:  # an item is observed once: when its first row is made
                latency = max(0.0, now - created[run_id])
                for _ in range(int(ok + bad - replaced)):
                    e2e.observe(latency)
