"""Hugging Face hub datasets, where the hub is reachable and the user asked for it
(`evalctl submit --task ... --hub`): a split is read from the hub's Parquet conversion of the
dataset (revision `refs/convert/parquet`, files `<config>/<split>/NNNN.parquet`, what
`datasets.load_dataset` would give, in order), a `data_files` entry of a hub dataset (c4's)
from the repository itself. Files go through the hub client's cache; each file is bounded.

Here the hub is not reachable: `--data-dir` points hub names at local files instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from evalstream.common.lmeval.errors import TaskDataError

PARQUET_REVISION = "refs/convert/parquet"
MAX_FILE_BYTES = 2 * 1024**3


class Hub(Protocol):
    def split_files(self, repo: str, config: str | None, split: str) -> list[tuple[str, bytes]]:
        """(name, bytes) of the Parquet files of one split, in order."""
        ...

    def repo_file(self, repo: str, path: str) -> bytes: ...


class HuggingFaceHub:
    """The hub through `huggingface_hub` (installed with transformers)."""

    def __init__(self) -> None:
        try:
            import huggingface_hub
        except ImportError:
            raise TaskDataError("the Hugging Face hub client (huggingface_hub) is not installed") from None
        self._hub = huggingface_hub
        self._listing: dict[str, list[str]] = {}

    def _download(self, repo: str, path: str, revision: str | None) -> bytes:
        try:
            local = self._hub.hf_hub_download(repo, path, repo_type="dataset", revision=revision)
        except Exception as exc:  # offline, not found, gated, network: each its own class
            raise TaskDataError(f"hub dataset {repo!r}, file {path}: {type(exc).__name__}: {exc}") from None
        file = Path(str(local))
        if file.stat().st_size > MAX_FILE_BYTES:
            raise TaskDataError(f"hub dataset {repo!r}, file {path}: over {MAX_FILE_BYTES} bytes")
        return file.read_bytes()

    def split_files(self, repo: str, config: str | None, split: str) -> list[tuple[str, bytes]]:
        if repo not in self._listing:
            try:
                self._listing[repo] = self._hub.HfApi().list_repo_files(
                    repo, repo_type="dataset", revision=PARQUET_REVISION
                )
            except Exception as exc:
                raise TaskDataError(f"hub dataset {repo!r}: {type(exc).__name__}: {exc}") from None
        prefix = f"{config or 'default'}/{split}/"
        names = sorted(f for f in self._listing[repo] if f.startswith(prefix) and f.endswith(".parquet"))
        if not names:
            raise TaskDataError(f"hub dataset {repo!r} has no Parquet files for {prefix.rstrip('/')}")
        return [(n, self._download(repo, n, PARQUET_REVISION)) for n in names]

    def repo_file(self, repo: str, path: str) -> bytes:
        return self._download(repo, path, None)
