"""A fault scenario: drive several runs at once, break things while they are provably in
flight, gather the history and hand it to the checker (checker.py).

A `Scenario` knows its runs (spread over the topics' partitions), the Kafka offsets at its
start, the aggregator process that counts its results, and when its fault began and
ended. After the runs end (or a deadline passes) it reads every effect of every item from
Kafka, PostgreSQL, S3 and the aggregator's /metrics (tests/faults/evidence.py), checks them,
and writes its row of faults.json. Every wait has a deadline and says what it waited for
(tests/faults/harness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from evalstream.common import topics
from evalstream.common.settings import Settings
from tests.faults.checker import RunCounters, RunHistory, Verdict, check
from tests.faults.evidence import (
    TimedRecord,
    aggregator_counters,
    aggregators,
    cache_entries_since,
    committed_offsets,
    count_rows,
    parquet_outcomes,
    recorded_since,
    result_records,
    row_outcomes,
    rows_by_run,
    run_rows,
    run_status,
    shard_records,
    stored_reports,
)
from tests.faults.harness import REPORT, SCALE, items, recovery_s, run_ids, submit, wait_for, write_dataset
from tests.support import ROOT, read_records, stack_cmd, upload_dataset
from tests.support import topic_end_offsets as end_offsets

# --------------------------------------------------------------------------- scenarios


def _prefix(run_id: str) -> str:
    return run_id.removeprefix("run-").replace("-", "")[:12] + "-"


@dataclass
class Run:
    run_id: str
    ids: frozenset[str]
    shard_size: int


@dataclass
class Scenario:
    """One scenario's runs, its fault window and what is needed to judge it afterwards."""

    name: str
    settings: Settings
    work_topic: str
    runs: dict[str, Run] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    fault_begin: float | None = None
    fault_end: float | None = None
    work_window: tuple[dict[int, int], dict[int, int]] | None = None  # work-topic offsets in flight
    results_at_fault: dict[int, int] | None = None  # eval.results end offsets when the fault began
    # the aggregator processes (their pids) -> the rows of each run when they started
    # counting: their counters together count what they wrote since
    baselines: dict[frozenset[int], dict[str, tuple[int, int, float]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    async def begin(self) -> Scenario:
        for topic in (topics.RESULTS, topics.DLQ, self.work_topic):
            self.offsets[topic] = await end_offsets(topic)
        if running := aggregators():
            self.baselines[frozenset(running.values())] = {}  # runs not yet submitted: they count all rows
        return self

    async def stage(self, tmp_path: Path, n: int, run_id: str) -> str:
        """The run's dataset, uploaded where `evalctl submit` puts it (the producer reads no
        local path): its s3:// URI. A run submitted during an S3 outage is staged before it."""
        path = write_dataset(tmp_path / f"{run_id}.jsonl", items(n, _prefix(run_id)))
        return await asyncio.to_thread(upload_dataset, self.settings, path)

    async def submit(
        self, tmp_path: Path, group: str, n: int, run_id: str, shard_size: int = 20, *,
        staged: str | None = None, **kw: Any,
    ) -> Run:  # fmt: skip
        uri = staged or await self.stage(tmp_path, n, run_id)
        await submit(self.settings, uri, run_id, group=group, shard_size=shard_size, **kw)
        ids = frozenset(r["id"] for r in items(n, _prefix(run_id)))
        run = self.runs[run_id] = Run(run_id, ids, shard_size)
        return run

    async def submit_many(
        self, tmp_path: Path, group: str, sizes: list[int], prefix: str, **kw: Any
    ) -> list[Run]:
        """Runs of the given sizes at once (ids drawn at random)."""
        ids = run_ids(prefix, len(sizes))
        return list(
            await asyncio.gather(
                *(self.submit(tmp_path, group, n, r, **kw) for n, r in zip(sizes, ids, strict=True))
            )
        )

    async def in_flight(self, at_least_rows: int = 1, timeout: float = 180) -> dict[str, int]:
        """Waits until every run has some results and none is complete; returns the rows."""
        counts: dict[str, int] = {}

        async def every_run_going() -> bool:
            for run in self.runs.values():
                counts[run.run_id] = await count_rows(self.settings, run.run_id)
            return all(min(at_least_rows, len(r.ids)) <= counts[r.run_id] for r in self.runs.values())

        await wait_for(every_run_going, timeout, f"{at_least_rows} results in each of {len(self.runs)} runs")
        return counts

    async def assert_in_flight(self) -> dict[str, int]:
        """Right after a fault was injected: the runs had not finished when it hit (rows only
        grow, so rows < total now means rows < total at the fault)."""
        counts = {r: await count_rows(self.settings, r) for r in self.runs}
        unfinished = {r: c for r, c in counts.items() if c < len(self.runs[r].ids)}
        assert unfinished, f"the fault hit after every run had finished: {counts}"
        self.extra["rows_at_fault"] = sum(counts.values())
        return counts

    async def fault_begins(self, batch_window: int = 4) -> None:
        """Call right before breaking something (Kafka must still be up). What is in flight
        now: the shards workers may be working on (up to `batch_window` records past their
        group's committed offset, per partition: a batch holds at most WORKER_MAX_SHARDS)
        and the results published but perhaps not yet recorded."""
        committed = await committed_offsets(self.work_topic)
        self.work_window = (committed, {p: off + batch_window for p, off in committed.items()})
        self.results_at_fault = await end_offsets(topics.RESULTS)
        self.fault_begin = time.time()

    async def in_flight_at_fault(self) -> set[tuple[str, str]]:
        assert self.work_window is not None and self.results_at_fault is not None
        runs = set(self.runs)
        start, end = self.work_window
        working = shard_records(await read_records(self.work_topic, start, end), runs)
        published = result_records(
            await read_records(topics.RESULTS, self.offsets[topics.RESULTS], self.results_at_fault),
            runs,
        )
        return {(t.run_id, i) for t in working + published for i in t.record.item_ids}

    def fault_ends(self) -> None:
        """Call when the fault is over: the killed thing is being restarted, the paused one
        resumed, the outage lifted. Recovery is measured from here."""
        self.fault_end = time.time()

    async def restart_stack(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> None:
        """`stack.py up`: dead aggregators come back. When none was running, the rows at that
        moment are the new processes' counting baseline (nothing wrote rows meanwhile); when
        one survived, what the dead one had counted is unknown, and the counters are judged
        for an excess only."""
        rows = None
        if not aggregators():
            rows = await self._rows_retrying()
        try:
            await asyncio.to_thread(stack_cmd, "up", *args, env=env)
        except subprocess.CalledProcessError:
            if check:
                raise
        running = aggregators()
        if rows is not None and running:
            self.baselines[frozenset(running.values())] = rows

    async def _rows_retrying(self) -> dict[str, tuple[int, int, float]] | None:
        for _ in range(20):
            try:
                return await rows_by_run(self.settings, list(self.runs))
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await asyncio.sleep(1)  # PostgreSQL may be down too: then nothing is unknown, only late
        return None

    async def wait_all_completed(self, timeout: float) -> str | None:
        """Waits for every run to complete; returns what did not (the checker says why)."""

        async def done() -> bool:
            return all([await run_status(self.settings, r) == "completed" for r in self.runs])

        try:
            await wait_for(done, timeout, f"{len(self.runs)} runs to complete", interval=0.5)
            return None
        except AssertionError as exc:
            return str(exc)

    async def wait_reports(self, timeout: float) -> None:
        """A completed run's report.json is written right after its completion: wait for it
        (the checker flags a report that never came)."""

        async def written() -> bool:
            found = await asyncio.to_thread(stored_reports, self.settings, sorted(self.runs))
            return all("unreadable" not in r for r in found.values())

        with contextlib.suppress(AssertionError):  # judged as missing, not raised here
            await wait_for(written, timeout, "the runs' reports")

    async def histories(self) -> tuple[list[RunHistory], list[TimedRecord]]:
        s = self.settings
        run_ids = set(self.runs)
        results = result_records(await read_records(topics.RESULTS, self.offsets[topics.RESULTS]), run_ids)
        dead = shard_records(await read_records(topics.DLQ, self.offsets[topics.DLQ]), run_ids)
        rows = await row_outcomes(s, list(run_ids))
        runs = await run_rows(s, list(run_ids))
        parquet = await asyncio.to_thread(parquet_outcomes, s, sorted(run_ids))
        reports = await asyncio.to_thread(stored_reports, s, sorted(run_ids))
        running = aggregators()
        counted = await asyncio.to_thread(aggregator_counters, run_ids, list(running)) if running else {}
        base_of_set = self.baselines.get(frozenset(running.values()))
        out = []
        for run_id, run in sorted(self.runs.items()):
            meta = runs.get(run_id, {})
            counters = None
            if run_id in counted:
                counters = RunCounters(
                    *counted[run_id],
                    baseline=None if base_of_set is None else base_of_set.get(run_id, (0, 0, 0.0)),
                )
            summary = meta.get("summary")
            out.append(
                RunHistory(
                    run_id=run_id,
                    expected=run.ids,
                    status=meta.get("status"),
                    total=meta.get("total"),
                    recorded=meta.get("recorded"),
                    rows=rows.get(run_id, []),
                    parquet=parquet.get(run_id, []),
                    log=[t.record for t in results + dead if t.run_id == run_id],
                    counters=counters,
                    reports={
                        **({"s3": reports[run_id]} if run_id in reports else {}),
                        **({"summary": summary} if summary else {}),
                    },
                    # the null engine is not cacheable: a cache entry would be an effect from nowhere
                    cache_entries=await cache_entries_since(s, self.wall0),
                    cacheable_answers=0,
                )
            )
        return out, results

    async def judge(self, timeout: float) -> ScenarioResult:
        """Waits for the runs (up to `timeout`) and their reports, checks every effect, writes
        faults.json."""
        not_done = await self.wait_all_completed(timeout)
        if not_done is None:
            await self.wait_reports(60)
        total_s = time.monotonic() - self.t0
        histories, results = await self.histories()
        shard_counts = {
            r: m.get("shard_count") or 0 for r, m in (await run_rows(self.settings, list(self.runs))).items()
        }
        verdicts = [check(h) for h in histories]
        recover = None
        if self.fault_end is not None and self.work_window is not None:
            in_flight = await self.in_flight_at_fault()
            recover = recovery_s(
                await recorded_since(self.settings, list(self.runs), self.fault_end),
                self.fault_end,
                in_flight,
            )
        result = ScenarioResult(self.name, verdicts, recover, total_s, not_done, dict(self.extra))
        result.extra.update(
            shards_total=sum(shard_counts.values()),
            run_sizes=sorted(len(r.ids) for r in self.runs.values()),
            result_partitions=sorted({t.record.partition for t in results}),
            # each run's results by partition: a run spreads over min(its shards, partitions)
            result_partitions_by_run={
                r: sorted({t.record.partition for t in results if t.run_id == r}) for r in sorted(self.runs)
            },
            shards_by_run={r: shard_counts.get(r, 0) for r in sorted(self.runs)},
            kafka_result_records=len(results),
            redelivered_items=sum(v.redelivered for v in verdicts),
            fault_s=None
            if self.fault_begin is None or self.fault_end is None
            else round(self.fault_end - self.fault_begin, 2),
        )
        result.write()
        return result


@dataclass
class ScenarioResult:
    name: str
    verdicts: list[Verdict]
    recover_s: float | None
    total_s: float
    not_done: str | None
    extra: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def explain(self) -> str:
        lines = [f"{self.name}: {self.not_done or 'every run completed'}"]
        for v in self.verdicts:
            lines.append(f"  {v.run_id}: {v.rows}/{v.items} rows, {v.kafka_records} Kafka records")
            lines += [f"    {a}" for a in v.anomalies]
        return "\n".join(lines)

    def write(self) -> None:
        """This scenario's row of faults.json (the README's table), with the commit it ran."""
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        table = json.loads(REPORT.read_text()) if REPORT.exists() else {}
        table[self.name] = {
            "items": sum(v.items for v in self.verdicts),
            "runs": len(self.verdicts),
            "lost": sum(v.lost_effects() for v in self.verdicts),
            "duplicated_effects": sum(v.duplicated_effects() for v in self.verdicts),
            "anomalies": [a for v in self.verdicts for a in v.anomalies],
            "every_run_completed": self.not_done is None,
            "recover_s": self.recover_s,
            "total_s": round(self.total_s, 2),
            "holds": self.ok,
            "scale": SCALE,
            "commit": _commit(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **self.extra,
        }
        REPORT.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")


def _commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout
    except OSError:
        return "unknown"
    return sha.strip() + ("+dirty" if dirty.strip() else "")
