"""Where a job may make the producer read, and how much (issue 12): no local file unless an
operator set a root, nothing outside it, no devices or FIFOs, sizes capped, plain names."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from evalstream.common.intake_limits import (
    MAX_JOB_BYTES,
    DatasetSourceError,
    job_limit_problems,
    max_item_bytes,
    read_dataset,
)
from evalstream.common.messages import MESSAGE_BUDGET_BYTES, JobSpec, encode
from evalstream.common.settings import Settings
from evalstream.producer.intake import job_problems

LINE = b'{"id": "1", "question": "2+2?", "answer": "4"}\n'


def _settings(**changes: object) -> Settings:
    return dataclasses.replace(Settings(), **changes)  # type: ignore[arg-type]


class _NoS3:
    """Reaching the store at all would be a bug in these tests."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"S3 used: {name}")


@pytest.mark.parametrize("path", ["/dev/zero", "/etc/passwd", "relative/data.jsonl", "/nonexistent.jsonl"])
def test_without_a_local_root_no_local_path_is_read_nor_probed(path: str) -> None:
    with pytest.raises(DatasetSourceError) as exc:
        read_dataset(path, _NoS3(), _settings())  # type: ignore[arg-type]
    # the same answer whether the file exists or not: nothing to learn about the host
    assert str(exc.value).endswith("this producer reads no local files (DATASET_LOCAL_ROOT is not set)")


def test_under_a_local_root_only_its_regular_files_are_read(tmp_path: Path) -> None:
    root = tmp_path / "datasets"
    root.mkdir()
    (root / "ok.jsonl").write_bytes(LINE)
    (tmp_path / "outside.jsonl").write_bytes(LINE)
    (root / "escape.jsonl").symlink_to(tmp_path / "outside.jsonl")
    os.mkfifo(root / "fifo.jsonl")
    (root / "big.jsonl").write_bytes(LINE * 100)
    settings = _settings(dataset_local_root=str(root), dataset_max_bytes=len(LINE) * 10)
    s3 = _NoS3()
    assert read_dataset("ok.jsonl", s3, settings) == (LINE, "ok.jsonl")  # type: ignore[arg-type]
    assert read_dataset(str(root / "ok.jsonl"), s3, settings) == (LINE, "ok.jsonl")  # type: ignore[arg-type]
    refused = {
        "../outside.jsonl": f"local datasets are read only under {root}",
        str(tmp_path / "outside.jsonl"): f"local datasets are read only under {root}",
        "escape.jsonl": f"local datasets are read only under {root}",  # a symlink out of the root
        "/dev/zero": f"local datasets are read only under {root}",
        "/etc/passwd": f"local datasets are read only under {root}",
        "fifo.jsonl": "fifo.jsonl is not a regular file",
        "big.jsonl": f"the dataset is {len(LINE) * 100} bytes, over the {len(LINE) * 10}-byte limit",
        "missing.jsonl": "cannot read missing.jsonl: No such file or directory",
    }
    for path, message in refused.items():
        with pytest.raises(DatasetSourceError) as exc:
            read_dataset(path, s3, settings)  # type: ignore[arg-type]
        assert str(exc.value) == message, path


def test_objects_are_read_only_from_the_datasets_bucket() -> None:
    settings = _settings()
    with pytest.raises(DatasetSourceError) as exc:
        read_dataset(f"s3://{settings.s3_bucket_results}/runs/r/manifest.json", _NoS3(), settings)  # type: ignore[arg-type]
    assert str(exc.value) == (
        f"datasets are read from the bucket {settings.s3_bucket_datasets!r} only, not {settings.s3_bucket_results!r}"
    )


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"run_id": "../../etc"}, "run_id", "run_id '../../etc' must be 1-128 characters"),
        ({"run_id": "run/1"}, "run_id", "run_id 'run/1' must be"),
        ({"run_id": "r" * 129}, "run_id", "must be 1-128 characters"),
        ({"worker_group": "a b"}, "worker_group", "worker_group 'a b' must be"),
        ({"name": "x\n" * 3}, "name", "name must be at most 200 printable characters"),
        ({"system_prompt": "x" * MAX_JOB_BYTES}, "job", "over the 65536-byte limit"),
    ],
)
def test_bad_names_and_oversized_jobs_are_problems(changes: dict[str, str], field: str, message: str) -> None:
    job = JobSpec(dataset="s3://evalstream-datasets/uploads/x/d.jsonl", **changes)  # type: ignore[arg-type]
    problems = [(f, m) for f, m in job_limit_problems(job)]
    assert [f for f, _ in problems] == [field]
    assert message in problems[0][1]
    assert any(p.field == field and message in p.message for p in job_problems(job))


def test_names_evalctl_and_reproductions_use_pass() -> None:
    job = JobSpec(
        dataset="s3://evalstream-datasets/uploads/x/d.jsonl",
        run_id="run-20261201-151500-0a1b2c3d",
        worker_group="gpu-a100_1.x",
        name="reproduce run-20261201-151500-0a1b2c3d",
    )
    assert job_limit_problems(job) == []


def test_an_item_must_fit_in_a_shard_beside_the_job() -> None:
    small = JobSpec(dataset="s3://b/k.jsonl")
    big = JobSpec(dataset="s3://b/k.jsonl", system_prompt="x" * 50_000)
    assert max_item_bytes(small) == MESSAGE_BUDGET_BYTES - len(encode(small)) - 2048
    assert max_item_bytes(small) - max_item_bytes(big) == len(encode(big)) - len(encode(small)) > 49_990
