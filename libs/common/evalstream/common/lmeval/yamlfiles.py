"""Reading lm-eval task YAML files as untrusted input.

A task YAML is read with PyYAML's safe loader: no Python object is ever constructed. lm-eval's
`!function module.name` tag (Python code next to the YAML) becomes a `FunctionRef` marker that
the config checks refuse under the key that holds it; any other tag is refused here.

`include` is resolved as lm-eval 0.4.13 does (tasks/_yaml_loader.py `load_yaml`): relative to
the including file's folder, the included files merged first in order, the file's own keys
last (a shallow merge; an included file's `task_list` is dropped). Every file read must lie
inside the task root (after resolving links), so a hostile `include: ../../../etc/passwd` or
a link out of the folder is refused; files, include depth and YAML nodes are bounded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evalstream.common.lmeval.errors import TaskError, TaskRefused

MAX_FILE_BYTES = 256 * 1024  # an lm-eval YAML is a few kB; the largest (CoT few-shot) ~40 kB
MAX_FILES = 64  # files read for one task (the YAML and everything it includes)
MAX_INCLUDE_DEPTH = 16
MAX_NODES = 200_000  # YAML values after alias expansion (a "billion laughs" file is refused)


@dataclass(frozen=True)
class FunctionRef:
    """lm-eval's `!function module.name`: Python code, never run here."""

    spec: str


@dataclass
class TaskFiles:
    """The files read for one task, in reading order, with their text (for the manifest)."""

    root: Path
    texts: dict[str, str] = field(default_factory=dict)  # path relative to root -> text

    def add(self, path: Path, text: str) -> None:
        self.texts.setdefault(relative(path, self.root), text)

    def sha256(self) -> str:
        return files_sha256(self.texts)


def files_sha256(texts: dict[str, str]) -> str:
    """Of a task's files, in order: path and text of each, length-prefixed."""
    h = hashlib.sha256()
    for path, text in texts.items():
        for part in (path.encode(), text.encode()):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()


class _Loader(yaml.SafeLoader):
    """The safe loader plus lm-eval's `!function` tag, read as a marker only."""


def _function(loader: yaml.SafeLoader, node: yaml.Node) -> FunctionRef:
    return FunctionRef(str(loader.construct_scalar(node)))  # type: ignore[arg-type]


_Loader.add_constructor("!function", _function)


def relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def inside(path: Path, root: Path) -> Path:
    """`path` resolved (links followed); raises TaskRefused when it is not under `root`."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise TaskRefused(
            f"{path} is outside the task root {root} (pass --task-root to allow a wider folder)"
        )
    return resolved


def read_text(path: Path, root: Path) -> str:
    resolved = inside(path, root)
    try:
        with resolved.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TaskError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise TaskRefused(f"{path} is over {MAX_FILE_BYTES} bytes: not a task YAML")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path} is not UTF-8: {exc}") from None


def parse(text: str, where: str) -> dict[str, Any]:
    try:
        value = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.constructor.ConstructorError as exc:
        tag = getattr(exc, "problem", "") or str(exc)
        raise TaskRefused(
            f"unsupported YAML tag ({tag}): only plain YAML and !function are read", where=where
        ) from None
    except yaml.YAMLError as exc:
        raise TaskError(f"not valid YAML: {exc}", where=where) from None
    if not isinstance(value, dict):
        raise TaskError(f"expected a mapping of keys, got {type(value).__name__}", where=where)
    _count_nodes(value, where)
    return value


def _count_nodes(value: Any, where: str) -> None:
    """Refuses a document whose values, with aliases expanded, exceed MAX_NODES."""
    count = 0
    stack = [value]
    while stack:
        v = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise TaskRefused(f"more than {MAX_NODES} YAML values (aliases expanded)", where=where)
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def load(path: Path, files: TaskFiles, *, _stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The config of the YAML at `path` with its includes merged, as lm-eval's load_yaml
    (recursive=True) returns it. Every file read is recorded in `files`."""
    resolved = inside(path, files.root)
    where = relative(resolved, files.root)
    if resolved in _stack:
        raise TaskRefused(
            "include cycle: " + " -> ".join(relative(p, files.root) for p in (*_stack, resolved))
        )
    if len(_stack) >= MAX_INCLUDE_DEPTH:
        raise TaskRefused(f"includes nested deeper than {MAX_INCLUDE_DEPTH}", where=where, key="include")
    if resolved not in files.texts and len(files.texts) >= MAX_FILES:
        raise TaskRefused(f"more than {MAX_FILES} files", where=where, key="include")
    text = read_text(resolved, files.root)
    files.add(resolved, text)
    cfg = parse(text, where)
    if "include" not in cfg:
        return cfg
    includes = cfg.pop("include")
    merged: dict[str, Any] = {}
    for i, inc in enumerate(includes if isinstance(includes, list) else [includes]):
        key = "include" if not isinstance(includes, list) else f"include[{i}]"
        if not isinstance(inc, str) or not inc:
            raise TaskRefused(f"expected a file name, got {inc!r}", where=where, key=key)
        target = Path(inc) if Path(inc).is_absolute() else resolved.parent / inc
        try:
            inc_cfg = load(target, files, _stack=(*_stack, resolved))
        except TaskError as exc:
            if exc.where is None:
                exc.where, exc.key = where, key
            raise
        inc_cfg.pop("task_list", None)
        merged.update(inc_cfg)
    merged.update(cfg)
    return merged
