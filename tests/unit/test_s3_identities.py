"""The table of S3 identities (libs/common s3_identities.py) against the object names each
component writes and reads: each may write exactly its own objects, users only their uploads;
the router and workers have no key pair. On the real store: tests/integration/test_store_privileges_s3.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalstream.aggregator.delta import TABLE_PATH
from evalstream.common import acls, keys, s3_identities
from evalstream.common.analysis import report_html
from evalstream.common.settings import S3Settings

ROOT = Path(__file__).resolve().parents[2]
S = S3Settings()
DATASETS, RESULTS = S.s3_bucket_datasets, S.s3_bucket_results
RUN = "run-20260101-000000-abcdef12"
SHA = "0f65" * 16

# (bucket, name) -> who writes it
WRITTEN = {
    (DATASETS, f"uploads/{SHA}/qa.jsonl"): acls.USER,  # evalctl submit
    (DATASETS, f"datasets/{SHA}/items.jsonl"): acls.PRODUCER,  # the stored copy
    (RESULTS, keys.run_object_name(RUN, "manifest.json")): acls.PRODUCER,
    (RESULTS, keys.segment_object_name(RUN, 3)): acls.AGGREGATOR,
    (RESULTS, keys.run_object_name(RUN, "report.json")): acls.AGGREGATOR,
    (RESULTS, report_html.object_name(RUN)): acls.AGGREGATOR,
    (RESULTS, f"{TABLE_PATH}/_delta_log/00000000000000000007.json"): acls.AGGREGATOR,
    (RESULTS, f"{TABLE_PATH}/run_id={RUN}/part-00001-abc.zstd.parquet"): acls.AGGREGATOR,
}


@pytest.mark.parametrize("principal", [acls.PRODUCER, acls.AGGREGATOR, acls.USER])
def test_each_principal_writes_its_own_objects_and_no_other(principal: str) -> None:
    may = {name for name in WRITTEN if s3_identities.allows(principal, "Write", *name)}
    assert may == {name for name, writer in WRITTEN.items() if writer == principal}
    for bucket in (DATASETS, RESULTS):  # and nothing else anywhere
        assert not s3_identities.allows(principal, "Write", bucket, "elsewhere/x")


def test_reads_and_lists() -> None:
    allows = s3_identities.allows
    # the producer reads uploads and stored copies (reproductions), the aggregator stored
    # copies (regrades), users stored copies (reproduce, regrade, datasets diff) and results
    for principal in (acls.PRODUCER, acls.AGGREGATOR, acls.USER):
        assert allows(principal, "Read", DATASETS, f"datasets/{SHA}/items.jsonl"), principal
    assert allows(acls.PRODUCER, "Read", DATASETS, f"uploads/{SHA}/qa.jsonl")
    assert not allows(acls.PRODUCER, "Read", RESULTS, keys.run_object_name(RUN, "report.json"))
    assert allows(acls.USER, "Read", RESULTS, keys.segment_object_name(RUN, 0))
    # listing: the Delta table's log (aggregator, users' DuckDB); nobody lists the datasets
    assert allows(acls.AGGREGATOR, "List", RESULTS) and allows(acls.USER, "List", RESULTS)
    assert not any(allows(p, "List", DATASETS) for p in (acls.PRODUCER, acls.AGGREGATOR, acls.USER))
    # buckets and policies: the admin's alone
    assert allows(acls.ADMIN, "Admin", "any-bucket")
    assert not any(allows(p, "Admin", DATASETS) for p in (acls.PRODUCER, acls.AGGREGATOR, acls.USER))


def test_the_router_and_workers_have_no_identity() -> None:
    assert set(s3_identities.identities()) == set(s3_identities.PRINCIPALS)
    for principal in s3_identities.NO_STORE:
        assert principal not in s3_identities.identities()
        assert not s3_identities.allows(principal, "Read", DATASETS, "uploads/x")
    # the worker's settings do not even read the store's
    from evalstream.common.settings import RouterSettings, WorkerSettings

    assert "s3_access_key" not in WorkerSettings.__dataclass_fields__
    assert "s3_access_key" not in RouterSettings.__dataclass_fields__


def test_uploads_go_where_users_may_write() -> None:
    """evalctl submit and the tests' uploads name keys under UPLOADS_PREFIX."""
    submit = (ROOT / "cli/evalstream/cli/submit.py").read_text()
    assert f'key = f"{s3_identities.UPLOADS_PREFIX}{{' in submit
    support = (ROOT / "tests/support.py").read_text()
    assert f'key = f"{s3_identities.UPLOADS_PREFIX}{{' in support


def test_bucket_names_follow_the_settings() -> None:
    custom = S3Settings(s3_bucket_datasets="d", s3_bucket_results="r")
    table = s3_identities.identities(custom)
    assert "Write:d/uploads/*" in table[acls.USER]
    assert "Write:r/runs/*/manifest.json" in table[acls.PRODUCER]
    assert s3_identities.allows(acls.USER, "Write", "d", "uploads/x", custom)
    assert not s3_identities.allows(acls.USER, "Write", DATASETS, "uploads/x", custom)


def test_the_identity_file_names_each_key_pair_with_its_actions() -> None:
    config = s3_identities.config({acls.USER: ("AK", "SK"), acls.ADMIN: ("AK2", "SK2")})
    identities = {i["name"]: i for i in config["identities"]}  # type: ignore[attr-defined]
    assert set(identities) == {acls.USER, acls.ADMIN}
    assert identities[acls.USER]["credentials"] == [{"accessKey": "AK", "secretKey": "SK"}]
    assert identities[acls.USER]["actions"] == list(s3_identities.identities()[acls.USER])
    assert "Admin" in identities[acls.ADMIN]["actions"]
