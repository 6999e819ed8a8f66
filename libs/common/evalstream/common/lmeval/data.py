"""A task's documents, read from local files as lm-eval's `datasets.load_dataset` gives them:
one dict per row with every column of the split (a value missing from a JSON line is None),
in file order, typed as Arrow reads them.

Where the data comes from:

* `dataset_path: json | csv | parquet` with `dataset_kwargs.data_files` (a file, a list, or
  `split: file(s)`; a plain file or list is the split `train`, as in `datasets`): paths
  relative to the YAML's folder (lm-eval resolves them against its working directory: run it
  from the YAML's folder to read the same files), inside the task root or the data folder;
  or `s3://<datasets bucket>/<key>` objects.
* a Hugging Face hub name (`dataset_path: openai/gsm8k`, `dataset_name: main`): the hub is not
  read from here; `--data-dir DIR` maps it to local files,
  `DIR/<dataset_path>/<dataset_name>/<split>.<ext>` (or `DIR/<dataset_path>/<split>.<ext>`
  without a dataset_name), ext one of jsonl, json, parquet, csv; a hub name with
  `data_files` (c4's) reads `DIR/<dataset_path>/<file>`.

JSON Lines and JSON arrays are read with Arrow's JSON reader (what `datasets` uses), Parquet
with Arrow. CSV, which `datasets` reads with pandas, is read with Arrow's CSV reader: an empty
cell is None here where pandas gives NaN.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalstream.common.lmeval.config import TaskConfig
from evalstream.common.lmeval.errors import TaskDataError, TaskRefused
from evalstream.common.lmeval.hub import Hub

BUILDERS = ("json", "csv", "parquet")
EXTENSIONS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet", ".csv": "csv"}
MAX_DATA_BYTES = 2 * 1024**3  # one data file
MAX_DOCS = 2_000_000

Fetch = Callable[[str], bytes]  # reads an s3:// object (the CLI's: datasets bucket only)


@dataclass(frozen=True)
class Split:
    docs: list[dict[str, Any]]
    features: list[str]  # column names, lm-eval's `self.features`


@dataclass(frozen=True)
class DataSource:
    yaml_dir: Path  # where relative data_files are resolved
    roots: tuple[Path, ...]  # local files must lie under one of these (resolved)
    data_dir: Path | None = None  # --data-dir
    fetch: Fetch | None = None
    hub: Hub | None = None  # --hub: hub names read from the Hugging Face hub (hub.py)


def _builder(path: str) -> str | None:
    return EXTENSIONS.get(Path(path).suffix.lower())


def _local(path: Path, src: DataSource, key: str) -> bytes:
    resolved = path.resolve()
    if not any(resolved.is_relative_to(r) for r in src.roots):
        raise TaskRefused(f"{path} is outside the task root and the data folder: not read", key=key)
    try:
        size = resolved.stat().st_size
        if size > MAX_DATA_BYTES:
            raise TaskDataError(f"{path} is over {MAX_DATA_BYTES} bytes", key=key)
        return resolved.read_bytes()
    except OSError as exc:
        raise TaskDataError(f"cannot read {path}: {exc.strerror}", key=key) from None


def _read_file(ref: str, base: Path, src: DataSource, key: str) -> tuple[bytes, str]:
    """(bytes, name) of a data file reference."""
    if ref.startswith("s3://"):
        if src.fetch is None:
            raise TaskDataError(f"{ref}: no object store to read it from here", key=key)
        return src.fetch(ref), ref.rsplit("/", 1)[-1]
    if "://" in ref:
        raise TaskRefused(
            f"{ref}: only local files and s3:// objects of the datasets bucket are read", key=key
        )
    path = Path(ref)
    return _local(path if path.is_absolute() else base / path, src, key), path.name


def parse_table(data: bytes, builder: str, name: str) -> Split:
    import pyarrow as pa

    try:
        if builder == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(io.BytesIO(data))
        elif builder == "csv":
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(io.BytesIO(data))
        else:
            import pyarrow.json as paj

            if data.lstrip()[:1] == b"[":  # a JSON array: as datasets, re-written as lines
                rows = json.loads(data)
                data = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode()
            block = min(max(len(data) + 1, 1 << 20), 1 << 30)
            table = paj.read_json(io.BytesIO(data), read_options=paj.ReadOptions(block_size=block))
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise TaskDataError(f"{name}: not readable as {builder}: {exc}") from None
    if table.num_rows > MAX_DOCS:
        raise TaskDataError(f"{name}: over {MAX_DOCS} rows")
    return Split(docs=table.to_pylist(), features=list(table.column_names))


def _concat(parts: list[Split], name: str) -> Split:
    if len(parts) == 1:
        return parts[0]
    features = parts[0].features
    for p in parts[1:]:
        if p.features != features:
            raise TaskDataError(
                f"{name}: files of one split have different columns ({features} vs {p.features})"
            )
    return Split([d for p in parts for d in p.docs], features)


def _files_splits(files: str | list[str] | dict[str, Any]) -> dict[str, list[str]]:
    if isinstance(files, str):
        return {"train": [files]}
    if isinstance(files, list):
        return {"train": list(files)}
    return {split: [paths] if isinstance(paths, str) else list(paths) for split, paths in files.items()}


def load_splits(cfg: TaskConfig, needed: set[str], src: DataSource) -> dict[str, Split]:
    """The splits of the task's data that `needed` names (missing ones are an error)."""
    path = cfg.dataset_path
    if path is None:
        raise TaskRefused("no dataset_path", key="dataset_path")
    if cfg.data_files is not None:
        return _data_files(cfg, path, needed, src)
    if path in BUILDERS:
        raise TaskRefused(f"dataset_path {path} needs dataset_kwargs.data_files", key="dataset_kwargs")
    _check_name(path, cfg.dataset_name)
    out: dict[str, Split] = {}
    folder = src.data_dir / path / (cfg.dataset_name or "") if src.data_dir is not None else None
    for split in sorted(needed):
        found = [c for c in (folder / f"{split}{ext}" for ext in EXTENSIONS) if c.is_file()] if folder else []
        if found:
            kind = _builder(found[0].name)
            assert kind is not None
            out[split] = parse_table(_local(found[0], src, "dataset_path"), kind, found[0].name)
        elif src.hub is not None:
            parts = [
                parse_table(data, "parquet", name)
                for name, data in src.hub.split_files(path, cfg.dataset_name, split)
            ]
            out[split] = _concat(parts, split)
        else:
            raise _not_local(path, cfg.dataset_name, split, folder)
    return out


def _data_files(cfg: TaskConfig, path: str, needed: set[str], src: DataSource) -> dict[str, Split]:
    assert cfg.data_files is not None
    by_split = _files_splits(cfg.data_files)
    out: dict[str, Split] = {}
    for split in sorted(needed):
        if split not in by_split:
            raise TaskDataError(
                f"no split {split!r} in data_files (have {', '.join(by_split)})",
                key="dataset_kwargs.data_files",
            )
        parts = []
        for ref in by_split[split]:
            builder = path if path in BUILDERS else _builder(ref)
            if builder is None:
                raise TaskRefused(f"{ref}: unknown file type", key="dataset_kwargs.data_files")
            key = f"dataset_kwargs.data_files.{split}"
            if path in BUILDERS:
                data, name = _read_file(ref, src.yaml_dir, src, key)
            else:  # files of a hub dataset's repository
                _check_name(path, None)
                if Path(ref).is_absolute() or ".." in Path(ref).parts or "://" in ref:
                    raise TaskRefused(f"{ref}: not a file of the dataset's repository", key=key)
                local = src.data_dir / path / ref if src.data_dir is not None else None
                if local is not None and local.is_file():
                    data, name = _local(local, src, key), local.name
                elif src.hub is not None:
                    data, name = src.hub.repo_file(path, ref), Path(ref).name
                else:
                    raise _not_local(
                        path, None, ref, src.data_dir / path if src.data_dir else None, file=True
                    )
            parts.append(parse_table(data, builder, name))
        out[split] = _concat(parts, split)
    return out


def _check_name(path: str, name: str | None) -> None:
    for value, key in ((path, "dataset_path"), (name, "dataset_name")):
        if value is None:
            continue
        parts = Path(value).parts
        if Path(value).is_absolute() or ".." in parts or not parts:
            raise TaskRefused(f"{value!r} is not a dataset name", key=key)


def _not_local(
    path: str, name: str | None, split: str, folder: Path | None, *, file: bool = False
) -> TaskDataError:
    """`split` is a split name, or with `file` a file of the dataset's repository."""
    rel = f"{path}/{name + '/' if name else ''}{split}" + ("" if file else ".jsonl")
    other = "" if file else " (or .json, .parquet, .csv)"
    if folder is None:
        return TaskDataError(
            f"{path!r} is a Hugging Face hub dataset, and the hub is not read from here: put its files "
            f"in a folder and pass --data-dir DIR, with DIR/{rel}{other}; or --hub where the hub is reachable",
            key="dataset_path",
        )
    return TaskDataError(
        f"no local copy: expected {folder.parent if file else folder}/{Path(rel).name}{other}",
        key="dataset_path",
    )
