"""The fault suite's checker, in the spirit of Jepsen's: a pure function from what was
observed (the history) to the anomalies it shows.

The history of one run is gathered after a scenario from every place an item leaves an
effect: the records on eval.results and eval.dlq (with their partition and offset), the
rows of item_results, runs.recorded (which drives completion), the aggregator's
per-run counters, the shard files in S3, the report (S3 report.json and runs.summary) and
the answer cache. The invariant is *exactly one effect per item in each of those places*:

* lost       - an item of the dataset with no row (Kafka carried a result or dead letter
               for it, so the pipeline had it and dropped it)
* unseen     - an item of the dataset that reached neither Kafka's result topics nor a row
* duplicated - an item or count whose effect is larger than its rows: a row twice, a
               recorded count, counter, Parquet file or report total above the rows
* diverged   - two places disagree on an item's outcome (Parquet says failed, the row
               says succeeded), or a count is below the rows (an effect went missing)
* stalled    - the run did not complete although it should have (or completed before
               every item had its row)

Kafka redelivery is expected (at-least-once transport); it is reported, never flagged:
exactly-once is a property of the effects, not of the log.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """One item's recorded outcome, wherever it was read from."""

    item_id: str
    failed: bool
    score: float = 0.0


@dataclass(frozen=True)
class LogRecord:
    """One record on eval.results or eval.dlq that carries items of the run."""

    topic: str
    partition: int
    offset: int
    item_ids: tuple[str, ...]


@dataclass(frozen=True)
class RunCounters:
    """The aggregator's per-run counters, and the rows that existed when the process that
    holds them started (its counters count only what it wrote itself). `baseline` None: the
    aggregator restarted at a moment nobody observed, so only an excess can be judged."""

    succeeded: float
    failed: float
    score: float
    baseline: tuple[int, int, float] | None = (0, 0, 0.0)  # succeeded rows, failed rows, score


@dataclass
class RunHistory:
    run_id: str
    expected: frozenset[str]  # item ids of the dataset
    status: str | None  # runs.status
    total: int | None  # runs.total
    recorded: int | None  # runs.recorded: the count completion is decided on
    rows: list[Outcome]  # item_results
    parquet: list[Outcome] | None  # the shard files in S3 (None: not read)
    log: list[LogRecord] = field(default_factory=list)
    counters: RunCounters | None = None
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # "s3" / "summary" -> totals
    cache_entries: int | None = None  # answer-cache entries written for the run's answers
    cacheable_answers: int | None = None  # distinct fresh answers that may be cached


@dataclass
class Verdict:
    run_id: str
    items: int
    rows: int
    lost: list[str] = field(default_factory=list)
    unseen: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)  # one line per duplicated effect
    diverged: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    redelivered: int = 0  # items carried by more than one Kafka record (allowed)
    kafka_records: int = 0

    @property
    def anomalies(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"lost {len(self.lost)} item(s), e.g. {self.lost[:3]}")
        if self.unseen:
            out.append(f"unseen {len(self.unseen)} item(s), e.g. {self.unseen[:3]}")
        if self.unexpected:
            out.append(
                f"{len(self.unexpected)} row(s) of items not in the dataset, e.g. {self.unexpected[:3]}"
            )
        out += [f"duplicated: {d}" for d in self.duplicated]
        out += [f"diverged: {d}" for d in self.diverged]
        out += [f"stalled: {s}" for s in self.stalled]
        return out

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def lost_effects(self) -> int:
        return len(self.lost) + len(self.unseen)

    def duplicated_effects(self) -> int:
        return len(self.duplicated)


def check(h: RunHistory) -> Verdict:
    rows_by_item = Counter(o.item_id for o in h.rows)
    carried = Counter(i for rec in h.log for i in set(rec.item_ids))
    v = Verdict(run_id=h.run_id, items=len(h.expected), rows=len(h.rows), kafka_records=len(h.log))
    v.redelivered = sum(1 for n in carried.values() if n > 1)
    missing = sorted(h.expected - set(rows_by_item))
    v.lost = [i for i in missing if carried[i]]
    v.unseen = [i for i in missing if not carried[i]]
    v.unexpected = sorted(set(rows_by_item) - h.expected)
    v.duplicated += [f"row of {i} x{n}" for i, n in sorted(rows_by_item.items()) if n > 1]

    succeeded = sum(1 for o in h.rows if not o.failed)
    failed = len(h.rows) - succeeded
    score = sum(o.score for o in h.rows)
    _compare(v, "runs.recorded", h.recorded, len(h.rows))
    _check_parquet(v, h)
    _check_counters(v, h.counters, succeeded, failed, score)
    _check_reports(v, h, succeeded, failed)
    cache, fresh = h.cache_entries, h.cacheable_answers
    if cache is not None and fresh is not None and cache > fresh:
        v.duplicated.append(f"answer cache: {cache} entries for {fresh} distinct fresh answers")
    _check_completion(v, h)
    return v


def _compare(v: Verdict, what: str, value: float | None, rows: float, tolerance: float = 0.0) -> None:
    """A count that should equal the rows: above them is a duplicated effect, below a lost one."""
    if value is None:
        v.diverged.append(f"{what} missing (rows: {rows:g})")
    elif value > rows + tolerance:
        v.duplicated.append(f"{what} {value:g} > rows {rows:g}")
    elif value < rows - tolerance:
        v.diverged.append(f"{what} {value:g} < rows {rows:g}")


def _check_parquet(v: Verdict, h: RunHistory) -> None:
    if h.parquet is None:
        return
    in_files = Counter(o.item_id for o in h.parquet)
    v.duplicated += [f"Parquet row of {i} x{n}" for i, n in sorted(in_files.items()) if n > 1]
    absent = sorted({o.item_id for o in h.rows} - set(in_files))
    if absent:
        v.diverged.append(f"{len(absent)} row(s) missing from Parquet, e.g. {absent[:3]}")
    extra = sorted(set(in_files) - {o.item_id for o in h.rows})
    if extra:
        v.duplicated.append(f"{len(extra)} Parquet row(s) with no database row, e.g. {extra[:3]}")
    row_failed = {o.item_id: o.failed for o in h.rows}
    differ = sorted(
        o.item_id for o in h.parquet if o.item_id in row_failed and row_failed[o.item_id] != o.failed
    )
    if differ:
        v.diverged.append(
            f"{len(differ)} item(s) whose Parquet outcome differs from the row, e.g. {differ[:3]}"
        )


def _check_reports(v: Verdict, h: RunHistory, succeeded: int, failed: int) -> None:
    """A completed run has both reports (S3's report.json and runs.summary), readable, and
    their totals are the rows."""
    if h.status == "completed":
        v.diverged += [f"report ({where}) missing" for where in ("s3", "summary") if where not in h.reports]
    for where, totals in sorted(h.reports.items()):
        if "unreadable" in totals:
            v.diverged.append(f"report ({where}) unreadable: {totals['unreadable']}")
            continue
        for name, actual in (("recorded", len(h.rows)), ("succeeded", succeeded), ("failed", failed)):
            _compare(v, f"report ({where}) {name}", totals.get(name), actual)


def _check_counters(v: Verdict, c: RunCounters | None, succeeded: int, failed: int, score: float) -> None:
    if c is None:
        return
    base = c.baseline
    observed = (
        ("succeeded", c.succeeded, succeeded),
        ("failed", c.failed, failed),
        ("score", c.score, score),
    )
    for i, (name, counted, rows) in enumerate(observed):
        what = f"aggregator counter {name}"
        if base is None:
            # the process restarted unobserved: it cannot have counted more than every row
            if counted > rows + 1e-6:
                v.duplicated.append(f"{what} {counted:g} > rows {rows:g}")
            continue
        _compare(v, what, counted, rows - base[i], tolerance=1e-6)


def _check_completion(v: Verdict, h: RunHistory) -> None:
    if h.total is None:
        v.stalled.append(f"run has no total (status {h.status})")
        return
    if h.total != len(h.expected):
        v.diverged.append(f"runs.total {h.total} != {len(h.expected)} items in the dataset")
    complete = len(h.rows) >= h.total
    if h.status == "completed" and not complete:
        v.stalled.append(f"completed with {len(h.rows)} of {h.total} rows")
    elif h.status != "completed":
        v.stalled.append(f"status {h.status} with {len(h.rows)} of {h.total} rows")


def check_all(histories: list[RunHistory]) -> list[Verdict]:
    return [check(h) for h in histories]
