"""The fault suite's checker: a clean history passes, and each planted anomaly is flagged
as the kind it is (a checker that cannot fail proves nothing)."""

from __future__ import annotations

import dataclasses

from tests.faults.checker import LogRecord, Outcome, RunCounters, RunHistory, check

IDS = [f"i{n:03d}" for n in range(10)]


def clean(**changes: object) -> RunHistory:
    """A run of 10 items, one failed, every effect in its place; redelivered once on Kafka."""
    rows = [Outcome(i, failed=(i == "i009"), score=0.0 if i == "i009" else 1.0) for i in IDS]
    h = RunHistory(
        run_id="r",
        expected=frozenset(IDS),
        status="completed",
        total=10,
        recorded=10,
        rows=rows,
        parquet=list(rows),
        log=[
            LogRecord("eval.results", 0, 5, tuple(IDS[:5])),
            LogRecord("eval.results", 0, 6, tuple(IDS[:5])),  # redelivered after a crash
            LogRecord("eval.results", 0, 7, tuple(IDS[5:9])),
            LogRecord("eval.dlq", 1, 3, ("i009",)),
        ],
        counters=RunCounters(succeeded=9, failed=1, score=9.0),
        reports={
            "s3": {"recorded": 10, "succeeded": 9, "failed": 1},
            "summary": {"recorded": 10, "succeeded": 9, "failed": 1},
        },
        cache_entries=9,
        cacheable_answers=9,
    )
    return dataclasses.replace(h, **changes)  # type: ignore[arg-type]


def test_a_clean_history_with_redelivery_has_no_anomaly() -> None:
    v = check(clean())
    assert v.ok, v.anomalies
    assert v.redelivered == 5 and v.kafka_records == 4
    assert v.lost_effects() == 0 and v.duplicated_effects() == 0


def test_a_lost_row_is_lost_when_kafka_carried_it_and_unseen_when_not() -> None:
    h = clean()
    rows = [o for o in h.rows if o.item_id not in ("i002", "i008")]
    log = [r for r in h.log if r.offset != 7] + [LogRecord("eval.results", 0, 7, ("i005", "i006", "i007"))]
    v = check(
        dataclasses.replace(
            h,
            rows=rows,
            parquet=rows,
            recorded=8,
            log=log,
            counters=RunCounters(7, 1, 7.0),
            reports={},
            status="running",
        )
    )
    assert v.lost == ["i002"]
    assert v.unseen == ["i008"]
    assert any("status running with 8 of 10" in s for s in v.stalled)
    assert v.lost_effects() == 2 and not v.ok


def test_a_doubled_recorded_count_is_a_duplicated_effect() -> None:
    v = check(clean(recorded=11))
    assert v.duplicated == ["runs.recorded 11 > rows 10"]


def test_a_recorded_count_below_the_rows_diverges() -> None:
    v = check(clean(recorded=9))
    assert v.diverged == ["runs.recorded 9 < rows 10"] and not v.duplicated


def test_a_counter_counted_twice_on_redelivery_is_flagged() -> None:
    v = check(clean(counters=RunCounters(succeeded=14, failed=1, score=14.0)))
    assert "aggregator counter succeeded 14 > rows 9" in v.duplicated
    assert "aggregator counter score 14 > rows 9" in v.duplicated


def test_counters_of_a_restarted_aggregator_count_from_their_baseline() -> None:
    # it restarted when 4 successes were recorded: it counts the other 5 and the failure
    assert check(clean(counters=RunCounters(5, 1, 5.0, baseline=(4, 0, 4.0)))).ok
    v = check(clean(counters=RunCounters(9, 1, 9.0, baseline=(4, 0, 4.0))))
    assert "aggregator counter succeeded 9 > rows 5" in v.duplicated
    # an unobserved restart: less is fine, more than every row is not
    assert check(clean(counters=RunCounters(2, 0, 2.0, baseline=None))).ok
    v = check(clean(counters=RunCounters(10, 1, 10.0, baseline=None)))
    assert "aggregator counter succeeded 10 > rows 9" in v.duplicated


def test_a_duplicated_row_is_flagged_even_if_the_schema_forbids_it() -> None:
    h = clean()
    v = check(dataclasses.replace(h, rows=[*h.rows, Outcome("i003", False, 1.0)], recorded=11))
    assert "row of i003 x2" in v.duplicated


def test_parquet_duplicates_gaps_strays_and_disagreements() -> None:
    h = clean()
    doubled = check(dataclasses.replace(h, parquet=[*h.rows, h.rows[0]]))
    assert doubled.duplicated == ["Parquet row of i000 x2"]
    gap = check(dataclasses.replace(h, parquet=h.rows[1:]))
    assert gap.diverged == ["1 row(s) missing from Parquet, e.g. ['i000']"]
    stray = check(dataclasses.replace(h, parquet=[*h.rows, Outcome("zzz", False)]))
    assert stray.duplicated == ["1 Parquet row(s) with no database row, e.g. ['zzz']"]
    flipped = check(dataclasses.replace(h, parquet=[Outcome("i000", True), *h.rows[1:]]))
    assert flipped.diverged == ["1 item(s) whose Parquet outcome differs from the row, e.g. ['i000']"]


def test_report_totals_are_checked_against_the_rows() -> None:
    v = check(clean(reports={"s3": {"recorded": 12, "succeeded": 11, "failed": 1}}))
    assert v.duplicated == ["report (s3) recorded 12 > rows 10", "report (s3) succeeded 11 > rows 9"]
    v = check(
        clean(
            reports={
                "s3": {"recorded": 10, "succeeded": 9, "failed": 1},
                "summary": {"recorded": 10, "succeeded": 9},
            }
        )
    )
    assert v.diverged == ["report (summary) failed missing (rows: 1)"]


def test_a_stuck_run_and_a_premature_completion_are_stalled() -> None:
    h = clean()
    stuck = check(dataclasses.replace(h, status="running"))
    assert stuck.stalled == ["status running with 10 of 10 rows"]
    early = check(
        dataclasses.replace(h, rows=h.rows[:9], parquet=h.rows[:9], recorded=9, counters=None, reports={})
    )
    assert early.stalled == ["completed with 9 of 10 rows"] and early.lost == ["i009"]
    no_total = check(clean(total=None, status="accepted"))
    assert no_total.stalled == ["run has no total (status accepted)"]


def test_cache_entries_beyond_the_fresh_answers_are_duplicated() -> None:
    v = check(clean(cache_entries=12))
    assert v.duplicated == ["answer cache: 12 entries for 9 distinct fresh answers"]


def test_rows_of_items_not_in_the_dataset_are_flagged() -> None:
    h = clean()
    v = check(dataclasses.replace(h, rows=[*h.rows, Outcome("x", False, 0.0)], recorded=11))
    assert v.unexpected == ["x"] and not v.ok


def test_a_completed_run_without_a_readable_report_is_flagged() -> None:
    h = clean()
    assert h.status == "completed" and check(h).ok
    missing = check(dataclasses.replace(h, reports={}))
    assert missing.diverged == ["report (s3) missing", "report (summary) missing"] and not missing.ok
    only_summary = check(dataclasses.replace(h, reports={"summary": h.reports["summary"]}))
    assert only_summary.diverged == ["report (s3) missing"]
    unreadable = {**h.reports, "s3": {"unreadable": "JSONDecodeError: Expecting value"}}
    assert check(dataclasses.replace(h, reports=unreadable)).diverged == [
        "report (s3) unreadable: JSONDecodeError: Expecting value"
    ]


def test_recovery_counts_only_items_not_in_flight_at_the_fault() -> None:
    from tests.faults.harness import recovery_s

    in_flight = {("r", "a"), ("r", "b")}
    rows = [("r", "z", 90.0), ("r", "a", 101.0), ("r", "b", 102.0), ("q", "a", 104.0), ("r", "c", 107.5)]
    assert recovery_s(rows, 100.0, in_flight) == 4.0  # ("q", "a") was not in flight: another run
    assert recovery_s([r for r in rows if r[0] == "r"], 100.0, in_flight) == 7.5
    assert recovery_s(rows[:3], 100.0, in_flight) is None
