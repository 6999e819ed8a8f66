"""Which tasks a path names: a task YAML, a group YAML (its members found among the YAML files
under the task root, as lm-eval's TaskManager indexes an include path), or a folder (every
task YAML under it). lm_eval/tasks/_index.py and _factory.py are the model: a YAML with
`group` is a group, one with `task` a task, a `tag` names several tasks; a group's keys other
than group/group_alias/task/aggregate_metric_list/metadata override its tasks' keys, and a
member given as a mapping overrides them again."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalstream.common.lmeval.config import GroupConfig, TaskConfig
from evalstream.common.lmeval.errors import TaskError, TaskRefused
from evalstream.common.lmeval.parse import parse_group, parse_task
from evalstream.common.lmeval.yamlfiles import TaskFiles, inside, load, relative

MAX_YAML_FILES = 5000  # YAML files indexed under one root
MAX_GROUP_TASKS = 1000
_IGNORE_DIRS = {"__pycache__", ".ipynb_checkpoints"}


@dataclass
class Entry:
    name: str
    kind: str  # "task", "group", "tag"
    path: Path | None
    cfg: dict[str, Any] = field(default_factory=dict)
    files: TaskFiles | None = None
    tasks: set[str] = field(default_factory=set)  # a tag's tasks


@dataclass(frozen=True)
class ResolvedTask:
    config: TaskConfig
    yaml_dir: Path  # the defining YAML's folder: relative data_files are read from there
    files: dict[str, str]  # path relative to the root -> text, the task's YAML first
    group: str | None = None


@dataclass
class Index:
    root: Path
    entries: dict[str, Entry] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # YAML files that are not tasks, and why


def _yaml_files(root: Path) -> list[Path]:
    found = sorted(
        (p for p in root.glob("**/*.yaml") if not any(part in _IGNORE_DIRS for part in p.parts)),
        key=lambda p: p.as_posix(),
    )
    if len(found) > MAX_YAML_FILES:
        raise TaskRefused(f"over {MAX_YAML_FILES} YAML files under {root}")
    return found


def build_index(root: Path) -> Index:
    index = Index(root)
    for path in _yaml_files(root):
        files = TaskFiles(root)
        try:
            cfg = load(path, files)
        except TaskError as exc:
            index.skipped.append(f"{relative(path.resolve(), root)}: {exc}")
            continue
        where = relative(path.resolve(), root)
        if "class" in cfg:
            index.skipped.append(f"{where}: a task written in Python (class): not supported")
            continue
        if "group" in cfg:
            name, kind = cfg["group"], "group"
        elif isinstance(cfg.get("task"), str):
            name, kind = cfg["task"], "task"
        else:
            index.skipped.append(f"{where}: neither a task nor a group")
            continue
        if not isinstance(name, str):
            index.skipped.append(f"{where}: a name that is not a string")
            continue
        if name in index.entries and index.entries[name].kind != "tag":
            index.skipped.append(f"{where}: {kind} {name!r} is already defined by {index.entries[name].path}")
            continue
        index.entries[name] = Entry(name, kind, path.resolve(), cfg, files)
        if kind == "task":
            tags = cfg.get("tag")
            for tag in [tags] if isinstance(tags, str) else tags if isinstance(tags, list) else []:
                if isinstance(tag, str):
                    index.entries.setdefault(tag, Entry(tag, "tag", None)).tasks.add(name)
    return index


def resolve(path: Path, root: Path | None = None) -> tuple[list[ResolvedTask], list[str]]:
    """The tasks `path` names, and notes (files of a folder that are not tasks)."""
    path = path.expanduser()
    base = (root or (path if path.is_dir() else path.parent)).expanduser().resolve()
    target = inside(path, base)
    if target.is_dir():
        index = build_index(target if root is None else base)
        chosen = [
            e for e in index.entries.values() if e.kind == "task" and e.path and e.path.is_relative_to(target)
        ]
        if not chosen:
            raise TaskError(f"no task YAML under {path}" + "".join(f"\n  {s}" for s in index.skipped))
        out = [_task(e.cfg, e, None, {}) for e in sorted(chosen, key=lambda e: str(e.path))]
        return out, index.skipped
    files = TaskFiles(base)
    cfg = load(target, files)
    where = relative(target, base)
    if "group" in cfg:
        index = build_index(base)
        group = parse_group(cfg, where)
        entry = Entry(group.group, "group", target, cfg, files)
        tasks = _group_tasks(group, entry, index, {}, depth=0)
        if not tasks:
            raise TaskError(f"group {group.group!r} has no tasks", where=where)
        return tasks, []
    if "class" in cfg:
        raise TaskRefused("a task written in Python: not supported", key="class", where=where)
    return [_task(cfg, Entry(str(cfg.get("task")), "task", target, cfg, files), None, {})], []


def _task(cfg: dict[str, Any], entry: Entry, group: Entry | None, overrides: dict[str, Any]) -> ResolvedTask:
    assert entry.files is not None and entry.path is not None
    merged = {**cfg, **overrides}
    for key in ("group", "task_list"):  # TaskFactory._build_task drops them (and `tag`, kept here: inert)
        merged.pop(key, None)
    where = relative(entry.path, entry.files.root)
    config = parse_task(merged, where)
    texts = dict(entry.files.texts)
    if group is not None and group.files is not None:
        for p, t in group.files.texts.items():
            texts.setdefault(p, t)
    return ResolvedTask(config, entry.path.parent, texts, group.name if group else None)


def _group_tasks(
    group: GroupConfig, entry: Entry, index: Index, overrides: dict[str, Any], depth: int
) -> list[ResolvedTask]:
    if depth > 8:
        raise TaskRefused("groups nested deeper than 8", key="task", where=group.group)
    merged = {**group.overrides, **overrides}
    out: list[ResolvedTask] = []
    for i, item in enumerate(group.members):
        key = f"task[{i}]"
        if isinstance(item, dict) and "group" in item:
            name = item["group"]
            sub_overrides = {**merged, **{k: v for k, v in item.items() if k != "group"}}
            if isinstance(name, str) and name in index.entries and index.entries[name].kind == "group":
                sub = index.entries[name]
                out += _group_tasks(parse_group(sub.cfg, name), sub, index, sub_overrides, depth + 1)
            else:
                inline = parse_group(item, f"{group.group}::{name}")
                out += _group_tasks(inline, entry, index, overrides, depth + 1)
            continue
        if isinstance(item, str):
            base, item_overrides = item, dict(merged)
        else:
            if "task" not in item or not isinstance(item["task"], str):
                raise TaskRefused("a member mapping needs `task` or `group`", key=key, where=group.group)
            base, item_overrides = item["task"], {**merged, **item}
        found = index.entries.get(base)
        if found is None and isinstance(item, str):
            raise TaskRefused(
                f"no task, group or tag {base!r} under {index.root}", key=key, where=group.group
            )
        if found is None:  # an inline task, defined by the member's keys alone
            cfg = {**item_overrides, "task": f"{group.group}::{base}"}
            out.append(_task(cfg, entry, entry, {}))
        elif found.kind == "group":
            out += _group_tasks(parse_group(found.cfg, base), found, index, item_overrides, depth + 1)
        elif found.kind == "tag":
            for name in sorted(found.tasks):
                t = index.entries[name]
                out.append(_task(t.cfg, t, entry, {"task": name, **item_overrides}))
        else:
            out.append(_task(found.cfg, found, entry, {"task": base, **item_overrides}))
        if len(out) > MAX_GROUP_TASKS:
            raise TaskRefused(f"over {MAX_GROUP_TASKS} tasks", key="task", where=group.group)
    return out
