"""The sections of a task YAML checked one by one (dataset_kwargs, fewshot_config,
generation_kwargs, filter_list, metric_list): each either reproduced as lm-eval 0.4.13 does or
refused with its key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalstream.common.lmeval.config import (
    DATASET_KWARGS,
    DEFAULT_FILTERS,
    DEFAULT_MAX_GEN_TOKS,
    DEFAULT_METRICS,
    FEWSHOT_KEYS,
    FILTERS,
    GENERATION_KEYS,
    METRICS,
    SAMPLERS,
    FewshotConfig,
    FilterPipeline,
    FilterStep,
    Generation,
    Metric,
    Template,
)
from evalstream.common.lmeval.errors import TaskRefused


class Checker:
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


def parse_dataset_kwargs(c: Checker, value: Any) -> str | list[str] | dict[str, Any] | None:
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


def parse_fewshot(c: Checker, value: Any, base: FewshotConfig) -> FewshotConfig:
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


def parse_generation(c: Checker, value: Any, output_type: str, fewshot_delimiter: str) -> Generation | None:
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


def parse_filters(c: Checker, value: Any, output_type: str) -> tuple[FilterPipeline, ...]:
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


def parse_metrics(c: Checker, value: Any, output_type: str) -> tuple[Metric, ...]:
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
