"""An lm-eval task YAML's keys, checked one by one: each is either reproduced as lm-eval 0.4.13
does (lm_eval/config/task.py TaskConfig and FewshotConfig, api/task.py ConfigurableTask) or
refused with its name. Defaults are lm-eval's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from evalstream.common.lmeval.errors import TaskRefused
from evalstream.common.lmeval.yamlfiles import FunctionRef

OutputType = Literal["multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until"]
OUTPUT_TYPES: tuple[OutputType, ...] = (
    "multiple_choice",
    "loglikelihood",
    "loglikelihood_rolling",
    "generate_until",
)
# A template: a Jinja string or a field name, an index, a list (choices, targets) or a dict.
Template = str | int | list[Any] | dict[str, Any] | None

DEFAULT_MAX_GEN_TOKS = 256  # lm_eval.defaults.DEFAULT_MAX_GEN_TOKS
SAMPLERS = ("default", "first_n")  # lm_eval/api/samplers.py SAMPLER_REGISTRY
# lm_eval/api/registry.py DEFAULT_METRIC_REGISTRY
DEFAULT_METRICS: dict[str, tuple[str, ...]] = {
    "loglikelihood": ("perplexity", "acc"),
    "loglikelihood_rolling": ("word_perplexity", "byte_perplexity", "bits_per_byte"),
    "multiple_choice": ("acc", "acc_norm"),
    "generate_until": ("exact_match",),
}
# metric -> (its aggregation in lm-eval, the keyword options it takes here)
METRICS: dict[str, dict[str, tuple[str, frozenset[str]]]] = {
    "multiple_choice": {"acc": ("mean", frozenset()), "acc_norm": ("mean", frozenset())},
    "loglikelihood": {"acc": ("mean", frozenset()), "perplexity": ("perplexity", frozenset())},
    "loglikelihood_rolling": {
        "word_perplexity": ("weighted_perplexity", frozenset()),
        "byte_perplexity": ("weighted_perplexity", frozenset()),
        "bits_per_byte": ("bits_per_byte", frozenset()),
    },
    "generate_until": {
        "exact_match": (
            "mean",
            frozenset({"ignore_case", "ignore_punctuation", "ignore_numbers", "regexes_to_ignore"}),
        )
    },
}
FILTERS = ("regex", "take_first")  # lm_eval/filters: RegexFilter, TakeFirstFilter
GENERATION_KEYS = frozenset({"until", "max_gen_toks", "do_sample", "temperature", "top_p"})

# Keys with no effect on the rendered items or their grading here: kept, not refused.
INERT_KEYS = frozenset(
    {"task_alias", "tag", "should_decontaminate", "doc_to_decontamination_query", "metadata"}
)
# Keys of lm-eval's TaskConfig that this reader does not do, unless left at their default.
NOT_SUPPORTED = {
    "process_docs": "documents pre-processed by Python code",
    "process_results": "results scored by Python code",
    "custom_dataset": "a dataset built by Python code",
    "doc_to_image": "images (multimodal tasks)",
    "doc_to_audio": "audio (multimodal tasks)",
    "use_prompt": "promptsource prompts",
    "unsafe_code": "tasks that run model-written code",
    "class": "a task written in Python",
    "task_list": "task lists",
}
TASK_KEYS = frozenset(
    {
        "task",
        "dataset_path",
        "dataset_name",
        "dataset_kwargs",
        "training_split",
        "validation_split",
        "test_split",
        "fewshot_split",
        "doc_to_text",
        "doc_to_target",
        "doc_to_choice",
        "description",
        "target_delimiter",
        "fewshot_delimiter",
        "fewshot_config",
        "num_fewshot",
        "output_type",
        "generation_kwargs",
        "repeats",
        "filter_list",
        "metric_list",
        "gen_prefix",
        *INERT_KEYS,
        *NOT_SUPPORTED,
    }
)
FEWSHOT_KEYS = frozenset(
    {
        "sampler",
        "split",
        "samples",
        "process_docs",
        "fewshot_indices",
        "doc_to_text",
        "doc_to_choice",
        "doc_to_target",
        "gen_prefix",
        "fewshot_delimiter",
        "target_delimiter",
    }
)
DATASET_KWARGS = frozenset({"data_files", "trust_remote_code", "verification_mode"})
GROUP_KEYS = frozenset({"group", "group_alias", "task", "aggregate_metric_list", "metadata"})


@dataclass(frozen=True)
class FewshotConfig:
    """lm-eval's FewshotConfig after `from_dict`: the task's own values unless overridden."""

    sampler: str
    split: str | None
    samples: list[dict[str, Any]] | None
    doc_to_text: Template
    doc_to_choice: Template
    doc_to_target: Template
    gen_prefix: str | None
    fewshot_delimiter: str
    target_delimiter: str


@dataclass(frozen=True)
class FilterStep:
    function: str  # "regex" or "take_first"
    regex_pattern: str = r"#### (\-?[0-9\.\,]+)"  # RegexFilter's defaults
    group_select: int = 0
    fallback: str = "[invalid]"

    def as_dict(self) -> dict[str, Any]:
        if self.function != "regex":
            return {"function": self.function}
        return {
            "function": "regex",
            "regex_pattern": self.regex_pattern,
            "group_select": self.group_select,
            "fallback": self.fallback,
        }


@dataclass(frozen=True)
class FilterPipeline:
    name: str
    steps: tuple[FilterStep, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "filter": [s.as_dict() for s in self.steps]}


# lm-eval's default when a task has no filter_list (ConfigurableTask.__init__)
DEFAULT_FILTERS = (FilterPipeline("none", (FilterStep("take_first"),)),)


@dataclass(frozen=True)
class Metric:
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.name, **self.options}


@dataclass(frozen=True)
class Generation:
    until: tuple[str, ...]
    max_gen_toks: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class TaskConfig:
    task: str
    output_type: OutputType
    dataset_path: str | None
    dataset_name: str | None
    data_files: str | list[str] | dict[str, Any] | None
    training_split: str | None
    validation_split: str | None
    test_split: str | None
    fewshot_split: str | None
    doc_to_text: Template
    doc_to_target: Template
    doc_to_choice: Template
    description: str
    target_delimiter: str
    fewshot_delimiter: str
    fewshot: FewshotConfig
    fewshot_configured: bool  # the YAML had a fewshot_config (its sampler is used)
    num_fewshot: int | None
    gen_prefix: str | None
    generation: Generation | None
    filters: tuple[FilterPipeline, ...]
    metrics: tuple[Metric, ...]
    tags: tuple[str, ...] = ()
    alias: str | None = None


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


class _Checker:
    def __init__(self, cfg: Mapping[str, Any], where: str | None) -> None:
        self.cfg = cfg
        self.where = where

    def refuse(self, key: str, message: str) -> TaskRefused:
        return TaskRefused(message, key=key, where=self.where)

    def text(self, key: str, value: Any, *, optional: bool = True) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.refuse(key, f"expected a string, got {type(value).__name__}")
        return value

    def template(self, key: str, value: Any) -> Template:
        if value is None or isinstance(value, str | list | dict):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise self.refuse(
            key, f"expected a template, field name, index, list or mapping, got {type(value).__name__}"
        )

    def integer(self, key: str, value: Any, low: int, high: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise self.refuse(key, f"expected an integer in {low}..{high}, got {value!r}")
        return value


def parse_task(cfg: Mapping[str, Any], where: str | None = None) -> TaskConfig:
    """The task config of a merged YAML (includes resolved). Raises TaskRefused naming the
    key for anything that is not reproduced."""
    refuse_functions(cfg, where)
    c = _Checker(cfg, where)
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

    data_files = _dataset_kwargs(c, cfg.get("dataset_kwargs"))
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
    fewshot = _fewshot(
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
        generation=_generation(c, cfg.get("generation_kwargs"), output_type, fewshot_delimiter),
        filters=_filters(c, cfg.get("filter_list"), output_type),
        metrics=_metrics(c, cfg.get("metric_list"), output_type),
        tags=tags,
        alias=cfg.get("task_alias") if isinstance(cfg.get("task_alias"), str) else None,
    )


def _dataset_kwargs(c: _Checker, value: Any) -> str | list[str] | dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise c.refuse("dataset_kwargs", f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in DATASET_KWARGS:
            raise c.refuse(
                f"dataset_kwargs.{key}",
                "not supported (data_files is; trust_remote_code and verification_mode have no effect on local files)",
            )
    files = value.get("data_files")
    if files is None:
        return None
    if isinstance(files, str):
        return files
    if isinstance(files, list) and files and all(isinstance(f, str) for f in files):
        return list(files)
    if isinstance(files, dict) and files:
        for split, paths in files.items():
            ok = isinstance(paths, str) or (
                isinstance(paths, list) and paths and all(isinstance(p, str) for p in paths)
            )
            if not isinstance(split, str) or not ok:
                raise c.refuse(f"dataset_kwargs.data_files.{split}", "expected a file name or a list of them")
        return dict(files)
    raise c.refuse("dataset_kwargs.data_files", "expected a file name, a list of them, or split: files")


def _fewshot(c: _Checker, value: Any, base: FewshotConfig) -> FewshotConfig:
    if value is None:
        return base
    if not isinstance(value, dict):
        raise c.refuse("fewshot_config", f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in FEWSHOT_KEYS:
            raise c.refuse(f"fewshot_config.{key}", "not a key of lm-eval's fewshot_config")
    if value.get("process_docs") is not None:
        raise c.refuse("fewshot_config.process_docs", "documents pre-processed by Python code: not supported")
    if value.get("fewshot_indices") is not None:
        raise c.refuse(
            "fewshot_config.fewshot_indices",
            "lm-eval 0.4.13 never passes it to its sampler (it has no effect there): refused, not ignored",
        )
    sampler = value.get("sampler", "default")
    if sampler not in SAMPLERS:
        raise c.refuse("fewshot_config.sampler", f"{sampler!r}: supported samplers are {', '.join(SAMPLERS)}")
    samples = value.get("samples")
    if samples is not None and (
        not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples)
    ):
        raise c.refuse("fewshot_config.samples", "expected a list of documents (mappings)")
    delimiters = {}
    for key in ("fewshot_delimiter", "target_delimiter"):
        v = value.get(key, getattr(base, key))
        delimiters[key] = c.text(f"fewshot_config.{key}", v, optional=False)
    return FewshotConfig(
        sampler=sampler,
        split=c.text("fewshot_config.split", value.get("split", base.split)),
        samples=samples,
        doc_to_text=c.template("fewshot_config.doc_to_text", value.get("doc_to_text", base.doc_to_text)),
        doc_to_choice=c.template(
            "fewshot_config.doc_to_choice", value.get("doc_to_choice", base.doc_to_choice)
        ),
        doc_to_target=c.template(
            "fewshot_config.doc_to_target", value.get("doc_to_target", base.doc_to_target)
        ),
        gen_prefix=c.text("fewshot_config.gen_prefix", value.get("gen_prefix", base.gen_prefix)),
        fewshot_delimiter=delimiters["fewshot_delimiter"] or "",
        target_delimiter=delimiters["target_delimiter"] or "",
    )


def _generation(c: _Checker, value: Any, output_type: str, fewshot_delimiter: str) -> Generation | None:
    if output_type != "generate_until":
        if value is not None:
            raise c.refuse(
                "generation_kwargs", f"only generate_until tasks generate (output_type {output_type})"
            )
        return None
    if value is None:  # lm_eval.defaults.default_gen_kwargs(fewshot_delimiter)
        return Generation((fewshot_delimiter,), DEFAULT_MAX_GEN_TOKS, 0.0, 1.0)
    if not isinstance(value, dict):
        raise c.refuse("generation_kwargs", f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in GENERATION_KEYS:
            raise c.refuse(
                f"generation_kwargs.{key}", f"not supported (supported: {', '.join(sorted(GENERATION_KEYS))})"
            )
    until = value.get("until", [fewshot_delimiter])  # TaskConfig.__post_init__
    if isinstance(until, str):
        until = [until]
    if not isinstance(until, list) or not all(isinstance(u, str) for u in until):
        raise c.refuse("generation_kwargs.until", "expected a string or a list of strings")
    max_gen_toks = c.integer(
        "generation_kwargs.max_gen_toks", value.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS), 1, 32768
    )
    do_sample = value.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise c.refuse("generation_kwargs.do_sample", f"expected true or false, got {do_sample!r}")
    temperature = value.get("temperature", 0.0)
    if not isinstance(temperature, int | float) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise c.refuse("generation_kwargs.temperature", f"expected a number in 0..2, got {temperature!r}")
    if do_sample and temperature == 0:
        raise c.refuse("generation_kwargs.do_sample", "do_sample with temperature 0: give a temperature")
    if not do_sample and temperature > 0:
        raise c.refuse(
            "generation_kwargs.temperature",
            "a temperature without do_sample: true (lm-eval's hf backend then decodes greedily): "
            "set do_sample or remove the temperature",
        )
    top_p = value.get("top_p", 1.0)
    if not isinstance(top_p, int | float) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise c.refuse("generation_kwargs.top_p", f"expected a number in (0, 1], got {top_p!r}")
    return Generation(tuple(until), max_gen_toks, float(temperature) if do_sample else 0.0, float(top_p))


def _filters(c: _Checker, value: Any, output_type: str) -> tuple[FilterPipeline, ...]:
    if value is None:
        return DEFAULT_FILTERS
    if output_type != "generate_until":
        raise c.refuse("filter_list", f"filters apply to generated answers (output_type {output_type})")
    if not isinstance(value, list) or not value:
        raise c.refuse("filter_list", "expected a non-empty list of {name, filter}")
    out = []
    for i, entry in enumerate(value):
        key = f"filter_list[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"name", "filter"}:
            raise c.refuse(key, "expected {name, filter}")
        name = c.text(f"{key}.name", entry.get("name"), optional=False)
        steps_raw = entry.get("filter")
        if not isinstance(steps_raw, list) or not steps_raw:
            raise c.refuse(f"{key}.filter", "expected a non-empty list of {function, ...}")
        steps = []
        for j, step in enumerate(steps_raw):
            skey = f"{key}.filter[{j}]"
            if not isinstance(step, dict):
                raise c.refuse(skey, "expected {function, ...}")
            function = step.get("function")
            if function not in FILTERS:
                raise c.refuse(
                    f"{skey}.function", f"{function!r}: supported filters are {', '.join(FILTERS)}"
                )
            options = {k: v for k, v in step.items() if k != "function"}
            if function == "take_first":
                if options:
                    raise c.refuse(f"{skey}.{next(iter(options))}", "take_first takes no options")
                steps.append(FilterStep("take_first"))
                continue
            for k in options:
                if k not in ("regex_pattern", "group_select", "fallback"):
                    raise c.refuse(f"{skey}.{k}", "not an option of the regex filter")
            default = FilterStep("regex")
            pattern = c.text(
                f"{skey}.regex_pattern", options.get("regex_pattern", default.regex_pattern), optional=False
            )
            fallback = c.text(f"{skey}.fallback", options.get("fallback", default.fallback), optional=False)
            group_select = c.integer(f"{skey}.group_select", options.get("group_select", 0), -1000, 1000)
            assert pattern is not None and fallback is not None
            from evalstream.common.lmeval_filters import pattern_problem  # no cycle: filters is pure

            if problem := pattern_problem(pattern):
                raise c.refuse(f"{skey}.regex_pattern", problem)
            steps.append(FilterStep("regex", pattern, group_select, fallback))
        if steps[-1].function != "take_first" or any(s.function == "take_first" for s in steps[:-1]):
            raise c.refuse(
                f"{key}.filter",
                "a filter pipeline must end with take_first (one answer per document), and only there",
            )
        assert name is not None
        out.append(FilterPipeline(name, tuple(steps)))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise c.refuse("filter_list", f"filter names repeat: {names}")
    return tuple(out)


def _metrics(c: _Checker, value: Any, output_type: str) -> tuple[Metric, ...]:
    known = METRICS[output_type]
    if value is None:
        return tuple(Metric(m) for m in DEFAULT_METRICS[output_type])
    if not isinstance(value, list) or not value:
        raise c.refuse("metric_list", "expected a non-empty list of {metric, ...}")
    out = []
    for i, entry in enumerate(value):
        key = f"metric_list[{i}]"
        if not isinstance(entry, dict) or "metric" not in entry:
            raise c.refuse(key, "expected {metric, ...}")
        name = entry["metric"]
        if name not in known:
            raise c.refuse(
                f"{key}.metric",
                f"{name!r} is not supported for {output_type} (supported: {', '.join(known)})",
            )
        aggregation, options = known[name]
        if entry.get("aggregation", aggregation) != aggregation:
            raise c.refuse(
                f"{key}.aggregation", f"{entry['aggregation']!r}: {name} is aggregated by {aggregation}"
            )
        if entry.get("hf_evaluate"):
            raise c.refuse(f"{key}.hf_evaluate", "metrics from the evaluate library are not supported")
        if "higher_is_better" in entry and not isinstance(entry["higher_is_better"], bool):
            raise c.refuse(f"{key}.higher_is_better", "expected true or false")
        kwargs = {
            k: v
            for k, v in entry.items()
            if k not in ("metric", "aggregation", "higher_is_better", "hf_evaluate")
        }
        for k, v in kwargs.items():
            if k not in options:
                raise c.refuse(f"{key}.{k}", f"not an option of {name} here")
            if k == "regexes_to_ignore":
                if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
                    raise c.refuse(f"{key}.{k}", "expected a list of patterns")
                from evalstream.common.lmeval_filters import pattern_problem

                for j, p in enumerate(v):
                    if problem := pattern_problem(p):
                        raise c.refuse(f"{key}.{k}[{j}]", problem)
            elif not isinstance(v, bool):
                raise c.refuse(f"{key}.{k}", "expected true or false")
        out.append(Metric(name, kwargs))
    return tuple(out)


@dataclass(frozen=True)
class GroupConfig:
    group: str
    members: tuple[str | dict[str, Any], ...]
    overrides: dict[str, Any]  # task keys set for every member (lm-eval's group-level overrides)
    aggregate_metric_list: tuple[dict[str, Any], ...] = ()


def parse_group(cfg: Mapping[str, Any], where: str | None = None) -> GroupConfig:
    """A group YAML (lm-eval's GroupConfig, the other keys overriding its tasks' keys)."""
    refuse_functions(cfg, where)
    c = _Checker(cfg, where)
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
