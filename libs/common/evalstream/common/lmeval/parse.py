"""A task or group YAML (includes resolved) checked key by key into its TaskConfig or
GroupConfig; `!function` anywhere is refused (this reader runs no code from a task)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalstream.common.lmeval.config import (
    GROUP_KEYS,
    NOT_SUPPORTED,
    OUTPUT_TYPES,
    TASK_KEYS,
    FewshotConfig,
    GroupConfig,
    TaskConfig,
)
from evalstream.common.lmeval.errors import TaskRefused
from evalstream.common.lmeval.sections import (
    Checker,
    parse_dataset_kwargs,
    parse_fewshot,
    parse_filters,
    parse_generation,
    parse_metrics,
)
from evalstream.common.lmeval.yamlfiles import FunctionRef


def _path(prefix: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else key


def find_function(value: Any, key: str) -> tuple[str, FunctionRef] | None:
    """The first `!function` under `value` (with its key path)."""
    stack: list[tuple[str, Any]] = [(key, value)]
    while stack:
        k, v = stack.pop()
        if isinstance(v, FunctionRef):
            return k, v
        if isinstance(v, dict):
            stack.extend((_path(k, str(kk)), vv) for kk, vv in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((_path(k, i), vv) for i, vv in reversed(list(enumerate(v))))
    return None


def refuse_functions(cfg: Mapping[str, Any], where: str | None) -> None:
    for key, value in cfg.items():
        found = find_function(value, str(key))
        if found is not None:
            path, ref = found
            raise TaskRefused(
                f"!function {ref.spec} is Python code: refused (this reader runs no code from a task)",
                key=path,
                where=where,
            )


def parse_task(cfg: Mapping[str, Any], where: str | None = None) -> TaskConfig:
    """The task config of a merged YAML (includes resolved). Raises TaskRefused naming the
    key for anything that is not reproduced."""
    refuse_functions(cfg, where)
    c = Checker(cfg, where)
    for key in cfg:
        if not isinstance(key, str) or key not in TASK_KEYS:
            raise c.refuse(str(key), "not a key of an lm-eval 0.4.13 task config")
    for key, what in NOT_SUPPORTED.items():
        value = cfg.get(key)
        if value is not None and value is not False:
            raise c.refuse(key, f"{what}: not supported")
    name = c.text("task", cfg.get("task"), optional=False)
    assert name is not None
    if not name.strip():
        raise c.refuse("task", "empty task name")
    output_type = cfg.get("output_type", "generate_until")
    if output_type not in OUTPUT_TYPES:
        raise c.refuse("output_type", f"{output_type!r} is not one of {', '.join(OUTPUT_TYPES)}")
    repeats = cfg.get("repeats", 1)
    if repeats != 1:
        raise c.refuse("repeats", f"repeats {repeats!r}: only 1 is supported")

    data_files = parse_dataset_kwargs(c, cfg.get("dataset_kwargs"))
    splits = {
        k: c.text(k, cfg.get(k))
        for k in ("training_split", "validation_split", "test_split", "fewshot_split")
    }
    if splits["test_split"] is None and splits["validation_split"] is None:
        raise c.refuse("test_split", "the task has neither test_split nor validation_split to evaluate")
    description = cfg.get("description", "")
    if description is None:
        description = ""
    description = c.text("description", description)
    target_delimiter = c.text("target_delimiter", cfg.get("target_delimiter", " "), optional=False)
    fewshot_delimiter = c.text("fewshot_delimiter", cfg.get("fewshot_delimiter", "\n\n"), optional=False)
    assert target_delimiter is not None and fewshot_delimiter is not None
    gen_prefix = c.text("gen_prefix", cfg.get("gen_prefix"))
    doc_to_text = c.template("doc_to_text", cfg.get("doc_to_text"))
    doc_to_target = c.template("doc_to_target", cfg.get("doc_to_target"))
    doc_to_choice = c.template("doc_to_choice", cfg.get("doc_to_choice"))
    num_fewshot = cfg.get("num_fewshot")
    if num_fewshot is not None:
        num_fewshot = c.integer("num_fewshot", num_fewshot, 0, 1000)
    if output_type == "multiple_choice" and doc_to_choice is None:
        raise c.refuse("doc_to_choice", "a multiple_choice task needs doc_to_choice")
    fewshot_raw = cfg.get("fewshot_config")
    fewshot = parse_fewshot(
        c,
        fewshot_raw,
        FewshotConfig(
            sampler="default",
            split=splits["fewshot_split"],
            samples=None,
            doc_to_text=doc_to_text,
            doc_to_choice=doc_to_choice,
            doc_to_target=doc_to_target,
            gen_prefix=gen_prefix,
            fewshot_delimiter=fewshot_delimiter,
            target_delimiter=target_delimiter,
        ),
    )
    tags_raw = cfg.get("tag")
    tags = (
        (tags_raw,) if isinstance(tags_raw, str) else tuple(t for t in tags_raw or () if isinstance(t, str))
    )
    return TaskConfig(
        task=name,
        output_type=output_type,
        dataset_path=c.text("dataset_path", cfg.get("dataset_path")),
        dataset_name=c.text("dataset_name", cfg.get("dataset_name")),
        data_files=data_files,
        training_split=splits["training_split"],
        validation_split=splits["validation_split"],
        test_split=splits["test_split"],
        fewshot_split=splits["fewshot_split"],
        doc_to_text=doc_to_text,
        doc_to_target=doc_to_target,
        doc_to_choice=doc_to_choice,
        description=description or "",
        target_delimiter=target_delimiter,
        fewshot_delimiter=fewshot_delimiter,
        fewshot=fewshot,
        fewshot_configured=fewshot_raw is not None,
        num_fewshot=num_fewshot,
        gen_prefix=gen_prefix,
        generation=parse_generation(c, cfg.get("generation_kwargs"), output_type, fewshot_delimiter),
        filters=parse_filters(c, cfg.get("filter_list"), output_type),
        metrics=parse_metrics(c, cfg.get("metric_list"), output_type),
        tags=tags,
        alias=cfg.get("task_alias") if isinstance(cfg.get("task_alias"), str) else None,
    )


def parse_group(cfg: Mapping[str, Any], where: str | None = None) -> GroupConfig:
    """A group YAML (lm-eval's GroupConfig, the other keys overriding its tasks' keys)."""
    refuse_functions(cfg, where)
    c = Checker(cfg, where)
    name = c.text("group", cfg.get("group"), optional=False)
    assert name is not None
    members = cfg.get("task")
    if isinstance(members, str):
        members = [members]
    if not isinstance(members, list) or not members:
        raise c.refuse("task", "a group lists its tasks under `task`")
    for i, m in enumerate(members):
        if not isinstance(m, str | dict):
            raise c.refuse(f"task[{i}]", "expected a task name or a mapping")
    agg = cfg.get("aggregate_metric_list") or []
    if isinstance(agg, dict):
        agg = [agg]
    if not isinstance(agg, list) or not all(isinstance(a, dict) for a in agg):
        raise c.refuse("aggregate_metric_list", "expected a list of {metric, ...}")
    for i, a in enumerate(agg):
        if a.get("aggregation", "mean") != "mean":
            raise c.refuse(
                f"aggregate_metric_list[{i}].aggregation", "only mean is supported (as in lm-eval)"
            )
    overrides = {k: v for k, v in cfg.items() if k not in GROUP_KEYS}
    for k in overrides:
        if k not in TASK_KEYS:
            raise c.refuse(k, "not a key of an lm-eval 0.4.13 group or task config")
    return GroupConfig(name, tuple(members), overrides, tuple(agg))
