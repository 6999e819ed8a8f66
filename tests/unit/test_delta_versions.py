"""The sink's transaction versions, kept between windows (aggregator/delta.py
TransactionVersions), on a real Delta table in a local folder: always what the table itself
answers, whoever committed since, and without replaying the log per identifier once known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from evalstream.aggregator.delta import DeltaResults, app_id
from evalstream.aggregator.store import RunMeta
from evalstream.common.results import RESULT_COLUMNS, ResultRow

META = {"run-1": RunMeta("null", "m" * 64, "d" * 64)}
APPS = [app_id("eval.results", p) for p in range(3)]


def row(item_id: str) -> ResultRow:
    out: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
    out.update(run_id="run-1", item_id=item_id)
    return tuple(out.values())


def truth(uri: str) -> dict[str, int | None]:
    table = DeltaTable(uri)
    return {a: table.transaction_version(a) for a in APPS}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The identifiers asked of the table's log."""
    asked: list[str] = []
    original = DeltaTable.transaction_version

    def transaction_version(self: DeltaTable, app: str) -> int | None:
        asked.append(app)
        return original(self, app)

    monkeypatch.setattr(DeltaTable, "transaction_version", transaction_version)
    return asked


def test_versions_follow_every_writer_and_are_read_once(tmp_path: Path, counted: list[str]) -> None:
    uri = str(tmp_path / "table")
    mine, theirs = DeltaResults(uri, {}), DeltaResults(uri, {})
    assert mine.held(APPS) == dict.fromkeys(APPS)  # no table yet

    mine.commit([row("a")], [], META, {APPS[0]: 10})
    theirs.held(APPS)  # the other aggregator's first look: read from the log
    theirs.commit([row("b")], [], META, {APPS[1]: 7, APPS[2]: 3})
    expected = truth(uri)
    counted.clear()
    assert mine.held(APPS) == expected == {APPS[0]: 10, APPS[1]: 7, APPS[2]: 3}
    assert counted == APPS  # its first look: one read per identifier
    counted.clear()

    for n in range(3):  # windows of both, one after the other
        mine.held(APPS)
        mine.commit([row(f"m{n}")], [], META, {APPS[0]: 11 + n})
        theirs.held(APPS)
        theirs.commit([row(f"t{n}")], [], META, {APPS[1]: 8 + n})
    DeltaTable(uri).optimize.compact()  # a run's compaction carries no transaction
    expected = truth(uri)
    counted.clear()
    assert mine.held(APPS) == theirs.held(APPS) == expected == {APPS[0]: 13, APPS[1]: 10, APPS[2]: 3}
    assert counted == []  # known from the commits' own record of them


def test_a_commit_of_another_writer_sends_every_identifier_back_to_the_log(
    tmp_path: Path, counted: list[str]
) -> None:
    uri = str(tmp_path / "table")
    mine = DeltaResults(uri, {})
    mine.commit([row("a")], [], META, {APPS[0]: 5})
    assert mine.held(APPS)[APPS[0]] == 5
    # a writer that records its transaction but not in evalstream's commit info
    write_deltalake(
        uri,
        pa.table({"x": [1]}),
        mode="append",
        schema_mode="merge",
        commit_properties=CommitProperties(app_transactions=[Transaction(APPS[0], 99)]),
    )
    expected = truth(uri)
    counted.clear()
    assert mine.held(APPS) == expected == {APPS[0]: 99, APPS[1]: None, APPS[2]: None}
    assert sorted(counted) == sorted(APPS)


def test_a_table_made_anew_is_read_anew(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    mine = DeltaResults(uri, {})
    for v in (4, 6):
        mine.commit([row(str(v))], [], META, {APPS[0]: v})
    assert mine.held(APPS)[APPS[0]] == 6
    mine.versions.as_of = 10**6  # as if the table had been older than the last look
    assert mine.held(APPS) == truth(uri)


def test_upkeep_commits_carry_no_transaction(tmp_path: Path, counted: list[str]) -> None:
    """The table's upkeep (new settings, a vacuum) commits too: the versions known stay
    known across those commits, as across a compaction."""
    uri = str(tmp_path / "table")
    mine = DeltaResults(uri, {}, config={"delta.setTransactionRetentionDuration": "interval 30 days"})
    mine.commit([row("a")], [], META, {APPS[0]: 5})
    mine.commit([row("b")], [], META, {APPS[1]: 9})
    assert mine.held(APPS) == truth(uri)
    mine.compact("run-1")
    before = DeltaTable(uri).version()
    # new settings (no tombstone retention): the upkeep sets them and vacuums the compacted files
    upkeep = DeltaResults(uri, {}, config={"delta.deletedFileRetentionDuration": "interval 0 hours"})
    assert upkeep.maintain() == {"properties_set": 1, "files_vacuumed": 2}
    operations = {c["operation"] for c in DeltaTable(uri).history(limit=DeltaTable(uri).version() - before)}
    assert {"SET TBLPROPERTIES", "VACUUM START", "VACUUM END"} <= operations
    counted.clear()
    assert mine.held(APPS) == {APPS[0]: 5, APPS[1]: 9, APPS[2]: None}
    assert counted == []
