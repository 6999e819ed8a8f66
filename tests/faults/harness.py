"""The fault suite's tools: drive several runs at once, break things while they are
provably in flight, gather the history and hand it to the checker (checker.py).

A `Scenario` knows its runs (spread over the topics' partitions), the Kafka offsets at its
start, the aggregator process that counts its results, and when its fault began and
ended. After the runs end (or a deadline passes) it reads every effect of every item from
Kafka, PostgreSQL, S3 and the aggregator's /metrics, checks them, and writes its row of
faults.json. Every wait has a deadline and says what it waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from evalstream.common import storage, topics
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.lag import topic_partitions
from evalstream.common.messages import (
    GenerationParams,
    JobSpec,
    RetryPolicy,
    Shard,
    ShardResult,
    decode,
    encode,
)
from evalstream.common.settings import SERVICE_PORTS, Settings
from tests.faults.checker import LogRecord, Outcome, RunCounters, RunHistory, Verdict, check
from tests.support import (
    ROOT,
    STACK,
    admin_database_url,
    admin_kafka,
    read_records,
    stack_cmd,
    unique,
    upload_dataset,
    wait_until,
)
from tests.support import topic_end_offsets as end_offsets

# make test-faults runs the large sizes (1.0); make test runs every scenario scaled down.
SCALE = float(os.environ.get("FAULTS_SCALE", "1"))
REPORT = Path(
    os.environ.get(
        "FAULTS_REPORT",
        ROOT / "bench" / "results" / "faults.json"
        if SCALE >= 1
        else ROOT / "tests" / "artifacts" / "faults.json",
    )
)
PORT_OFFSET = int(os.environ.get("EVALSTREAM_PORT_OFFSET", "0"))
REPLICA_PORT_BASE = 8130  # aggregator-1, -2, ... (ops/local/localstack/prometheus.py)


def scaled(n: int, floor: int) -> int:
    """A scenario's size at this suite's scale, never below what its point needs."""
    return max(floor, int(n * SCALE))


def run_ids(prefix: str, n: int) -> list[str]:
    """n fresh run ids, drawn at random: nothing may depend on where a run's messages land
    (one run spreads over every partition whatever its id, spread.py)."""
    return [unique(f"run-{prefix}") for _ in range(n)]


# --------------------------------------------------------------------------- the stack


def stack_pid(name: str) -> int:
    if name == "postgres":
        return int((STACK / "postgres" / "postmaster.pid").read_text().splitlines()[0])
    return int((STACK / "run" / f"{name}.pid").read_text())


def alive_pid(name: str) -> int | None:
    """The process's pid while it runs; None once it is gone or a zombie (a process that
    died after `stack.py up` returned is nobody's child to reap)."""
    try:
        pid = stack_pid(name)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state == "Z" else pid


def kill(name: str, sig: int = signal.SIGKILL) -> None:
    pid = stack_pid(name)
    if name == "postgres":
        os.kill(pid, sig)  # the postmaster; its children follow
    else:
        os.killpg(pid, sig)


# --------------------------------------------------------------------------- datasets, jobs


def items(n: int, prefix: str) -> list[dict[str, Any]]:
    return [
        {"id": f"{prefix}{i:06d}", "question": f"What is {i} plus {i % 13}?", "answer": str(i + i % 13)}
        for i in range(n)
    ]


def write_dataset(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def submit(
    settings: Settings,
    dataset: str,
    run_id: str,
    *,
    group: str | None = None,
    shard_size: int = 20,
    max_attempts: int = 3,
    base_delay_s: float = 0.5,
    multiplier: float = 2.0,
) -> None:
    """Publishes the job straight to eval.jobs, as any Kafka client may. Retries while the
    broker is away (a run submitted mid-outage), up to five minutes."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    job = JobSpec(
        dataset=dataset,
        model="null",
        run_id=run_id,
        worker_group=group,
        shard_size=shard_size,
        retry=RetryPolicy(max_attempts=max_attempts, base_delay_s=base_delay_s, multiplier=multiplier),
        generation=GenerationParams(max_tokens=8),
    )
    deadline = time.monotonic() + 300
    while True:
        producer = AIOKafkaProducer(**client_kwargs(settings), acks="all")  # the users' principal
        try:
            await producer.start()
            await producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode())
            return
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)
        finally:
            await producer.stop()


# --------------------------------------------------------------------------- database reads


async def _fetchval(settings: Settings, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def count_rows(settings: Settings, run_id: str) -> int:
    return int(await _fetchval(settings, "SELECT count(*) FROM item_results WHERE run_id = $1", run_id))


async def run_status(settings: Settings, run_id: str) -> str | None:
    status: str | None = await _fetchval(settings, "SELECT status FROM runs WHERE run_id = $1", run_id)
    return status


async def rows_by_run(settings: Settings, run_ids: list[str]) -> dict[str, tuple[int, int, float]]:
    """(succeeded rows, failed rows, score sum) of each run, now."""
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, count(*) FILTER (WHERE error IS NULL) AS ok, count(*) FILTER (WHERE error IS NOT NULL)"
            " AS bad, coalesce(sum(score), 0) AS score FROM item_results WHERE run_id = ANY($1::text[]) GROUP BY run_id",
            run_ids,
        )
    finally:
        await conn.close()
    out = {r: (0, 0, 0.0) for r in run_ids}
    out.update({r["run_id"]: (int(r["ok"]), int(r["bad"]), float(r["score"])) for r in rows})
    return out


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.25
) -> float:
    """tests.support.wait_until, returning the seconds it took, where a check that raises
    OSError or a database error counts as not yet (the thing it reads may be what is down)."""
    t0 = time.monotonic()

    async def tolerant() -> bool:
        try:
            return await check()
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False

    await wait_until(tolerant, timeout, interval, what=what)
    return time.monotonic() - t0


async def wait_rows(settings: Settings, run_id: str, at_least: int, timeout: float) -> None:
    async def enough() -> bool:
        return await count_rows(settings, run_id) >= at_least

    await wait_for(enough, timeout, f"{at_least} results of run {run_id}")


async def wait_completed(settings: Settings, run_id: str, timeout: float) -> None:
    async def done() -> bool:
        return await run_status(settings, run_id) == "completed"

    await wait_for(done, timeout, f"run {run_id} to complete")


# --------------------------------------------------------------------------- Kafka reads


@dataclass(frozen=True)
class TimedRecord:
    record: LogRecord
    run_id: str
    timestamp: float  # unix seconds (the record's create time)


async def committed_offsets(work_topic: str) -> dict[int, int]:
    """The offsets a worker group has committed on its work topic (0 where none yet)."""
    group = topics.worker_consumer_group(work_topic.removeprefix(topics.WORK_PREFIX))
    consumer = AIOKafkaConsumer(**admin_kafka(), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        out = {}
        for p in await _partitions(consumer, work_topic):
            out[p] = await consumer.committed(TopicPartition(work_topic, p)) or 0
        return out
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    return sorted(tp.partition for tp in await topic_partitions(consumer, topic))


def result_records(records: list[Any], run_ids: set[str]) -> list[TimedRecord]:
    out = []
    for r in records:
        try:
            result = decode(r.value or b"", ShardResult)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if result.run_id in run_ids:
            ids = tuple(x.item_id for x in result.results)
            out.append(
                TimedRecord(LogRecord(r.topic, r.partition, r.offset, ids), result.run_id, r.timestamp / 1000)
            )
    return out


def shard_records(records: list[Any], run_ids: set[str]) -> list[TimedRecord]:
    out = []
    for r in records:
        try:
            shard = decode(r.value or b"", Shard)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if shard.run_id in run_ids:
            ids = tuple(i.id for i in shard.items)
            out.append(
                TimedRecord(LogRecord(r.topic, r.partition, r.offset, ids), shard.run_id, r.timestamp / 1000)
            )
    return out


def recovery_s(
    recorded: list[tuple[str, str, float]], fault_end: float, in_flight: set[tuple[str, str]]
) -> float | None:
    """Seconds from the fault's end to the first row (run_id, item_id, recorded at) of an
    item that was not in flight when the fault began (None: no such row came after it).
    Rows, not Kafka records: an outage of the aggregator's stores does not stop workers from
    publishing, only the pipeline from recording."""
    fresh = [t for run_id, item_id, t in recorded if t >= fault_end and (run_id, item_id) not in in_flight]
    return round(min(fresh) - fault_end, 2) if fresh else None


# --------------------------------------------------------------------------- the aggregator's counters


def aggregators() -> dict[str, int]:
    """The aggregator processes running now: name -> pid (`aggregator`, `aggregator-1`, ...)."""
    names = ["aggregator", *sorted(p.stem for p in (STACK / "run").glob("aggregator-*.pid"))]
    return {n: pid for n in names if (pid := alive_pid(n)) is not None}


def aggregator_port(name: str) -> int:
    index = name.removeprefix("aggregator").removeprefix("-")
    base = SERVICE_PORTS["aggregator"] if not index else REPLICA_PORT_BASE + int(index)
    return base + PORT_OFFSET


def aggregator_counters(run_ids: set[str], names: list[str]) -> dict[str, tuple[float, float, float]]:
    """The per-run counters (succeeded, failed, score) summed over the aggregators `names`,
    from their /metrics: each counts the rows it wrote itself."""
    out = {run_id: [0.0, 0.0, 0.0] for run_id in run_ids}
    for name in names:
        with urllib.request.urlopen(f"http://127.0.0.1:{aggregator_port(name)}/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                run_id = s.labels.get("run_id")
                if run_id not in out:
                    continue
                if s.name == "evalstream_run_items_total":
                    out[run_id][0 if s.labels.get("status") == "succeeded" else 1] += s.value
                elif s.name == "evalstream_run_score_total":
                    out[run_id][2] += s.value
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


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
            found = await asyncio.to_thread(_reports, self.settings, sorted(self.runs))
            return all("unreadable" not in r for r in found.values())

        with contextlib.suppress(AssertionError):  # judged as missing, not raised here
            await wait_for(written, timeout, "the runs' reports")

    async def histories(self) -> tuple[list[RunHistory], list[TimedRecord]]:
        s = self.settings
        run_ids = set(self.runs)
        results = result_records(await read_records(topics.RESULTS, self.offsets[topics.RESULTS]), run_ids)
        dead = shard_records(await read_records(topics.DLQ, self.offsets[topics.DLQ]), run_ids)
        rows = await _rows(s, list(run_ids))
        runs = await _runs(s, list(run_ids))
        parquet = await asyncio.to_thread(_parquet, s, sorted(run_ids))
        reports = await asyncio.to_thread(_reports, s, sorted(run_ids))
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
                    cache_entries=await _cache_entries(s, self.wall0),
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
            r: m.get("shard_count") or 0 for r, m in (await _runs(self.settings, list(self.runs))).items()
        }
        verdicts = [check(h) for h in histories]
        recover = None
        if self.fault_end is not None and self.work_window is not None:
            in_flight = await self.in_flight_at_fault()
            recover = recovery_s(
                await _recorded_since(self.settings, list(self.runs), self.fault_end),
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


async def _rows(settings: Settings, run_ids: list[str]) -> dict[str, list[Outcome]]:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, item_id, error, score FROM item_results WHERE run_id = ANY($1::text[])", run_ids
        )
    finally:
        await conn.close()
    out: dict[str, list[Outcome]] = {}
    for r in rows:
        out.setdefault(r["run_id"], []).append(
            Outcome(r["item_id"], r["error"] is not None, float(r["score"]))
        )
    return out


async def _recorded_since(
    settings: Settings, run_ids: list[str], since: float
) -> list[tuple[str, str, float]]:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, item_id, extract(epoch FROM recorded_at)::float8 AS t FROM item_results"
            " WHERE run_id = ANY($1::text[]) AND recorded_at >= to_timestamp($2)",
            run_ids,
            since,
        )
    finally:
        await conn.close()
    return [(r["run_id"], r["item_id"], r["t"]) for r in rows]


async def _runs(settings: Settings, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    conn = await asyncpg.connect(admin_database_url(), timeout=10)  # the checker reads every table
    try:
        rows = await conn.fetch(
            "SELECT run_id, status, total, recorded, shard_count, summary FROM runs WHERE run_id = ANY($1::text[])",
            run_ids,
        )
    finally:
        await conn.close()
    return {
        r["run_id"]: {**dict(r), "summary": json.loads(r["summary"]) if r["summary"] else None} for r in rows
    }


async def _cache_entries(settings: Settings, since: float) -> int:
    return int(
        await _fetchval(
            settings,
            "SELECT count(*) FROM answer_cache WHERE model = 'null' AND created_at >= to_timestamp($1)",
            since,
        )
    )


def _parquet(settings: Settings, run_ids: list[str]) -> dict[str, list[Outcome]]:
    s3 = storage.client(settings)
    out: dict[str, list[Outcome]] = {}
    for run_id in run_ids:
        got = out.setdefault(run_id, [])
        for obj in s3.list_objects(
            settings.s3_bucket_results, prefix=f"runs/{run_id}/results/", recursive=True
        ):
            table = pq.read_table(
                io.BytesIO(storage.get_bytes(s3, settings.s3_bucket_results, obj.object_name))
            )
            for item_id, error, score in zip(
                table.column("item_id").to_pylist(),
                table.column("error").to_pylist(),
                table.column("score").to_pylist(),
                strict=True,
            ):
                got.append(Outcome(item_id, error is not None, float(score or 0.0)))
    return out


def _reports(settings: Settings, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    s3 = storage.client(settings)
    out = {}
    for run_id in run_ids:
        try:
            out[run_id] = json.loads(
                storage.get_bytes(s3, settings.s3_bucket_results, f"runs/{run_id}/report.json")
            )
        except Exception as exc:  # missing or unreadable: kept, for the checker to flag
            out[run_id] = {"unreadable": f"{type(exc).__name__}: {exc}"[:300]}
    return out
