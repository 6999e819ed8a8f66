"""lm-eval 0.4.13's answer filters and its `exact_match` metric, as pure functions: what a
grader applies to a generated answer of an lm-eval `generate_until` task so that its grade is
lm-eval's (lm_eval/filters/extraction.py RegexFilter, filters/selection.py TakeFirstFilter,
api/metrics.py exact_match_hf_evaluate).

An item rendered by the task reader carries what they need in `meta.lm_eval`:

    "filters": [{"name": "strict-match",
                 "filter": [{"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)",
                             "group_select": 0, "fallback": "[invalid]"},
                            {"function": "take_first"}]}, ...]
    "metric": {"metric": "exact_match", "ignore_case": true, "regexes_to_ignore": [...]}

`grade(response, meta, gold)` reads them (`meta_problem` checks them first): the answer of each filter pipeline (the first pipeline's
is the item's grade, as the run's headline; lm-eval reports each), compared with the gold
answer as exact_match compares. Differences from evalstream's `regex` and `exact` graders
(why they are not used): RegexFilter takes the `group_select`-th match of `findall` (the
first by default, not the last) and of a match with several groups the first non-empty one;
no match gives the fallback; the raw response is searched (no reasoning or whitespace
stripping); and exact_match compares after only the options the task names (no case folding,
quote or "the answer is" stripping unless asked).

Patterns are untrusted: `compile_pattern` may be given a safe compiler (the worker's RE2 or
deadline-bounded one); the default is Python's `re`, as lm-eval's.

A module of its own, outside the task reader's package (evalstream.common.lmeval, which needs
YAML, Jinja and Arrow): the worker, the aggregator and the run summaries read it alone.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

MAX_PATTERN_CHARS = 2000
DEFAULT_PATTERN = r"#### (\-?[0-9\.\,]+)"  # RegexFilter's default regex_pattern


class CompiledPattern(Protocol):
    def findall(self, string: str) -> list[Any]: ...

    def sub(self, repl: str, string: str) -> str: ...


Compiler = Callable[[str], CompiledPattern]


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not a usable regular expression (Python syntax, as lm-eval's), or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"pattern over {MAX_PATTERN_CHARS} characters"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"bad pattern {pattern!r}: {exc}"
    return None


def regex_filter(
    response: str,
    pattern: str,
    group_select: int = 0,
    fallback: str = "[invalid]",
    compile_pattern: Compiler = re.compile,
) -> str:
    """lm-eval's RegexFilter on one response."""
    matches = compile_pattern(pattern).findall(response if isinstance(response, str) else "")
    if not matches:
        return fallback
    match = matches[group_select]  # an IndexError in lm-eval too (a group_select past the matches)
    if isinstance(match, tuple):
        found = [m for m in match if m]
        match = found[0] if found else fallback
    return str(match).strip()


def apply_pipeline(
    response: str, steps: Sequence[dict[str, Any]], compile_pattern: Compiler = re.compile
) -> str:
    """One filter pipeline (`filter_list[i].filter`) on one response (repeats are 1, so
    take_first keeps the response)."""
    out = response
    for step in steps:
        function = step.get("function")
        if function == "regex":
            out = regex_filter(
                out,
                step.get("regex_pattern", DEFAULT_PATTERN),
                int(step.get("group_select", 0)),
                str(step.get("fallback", "[invalid]")),
                compile_pattern,
            )
        elif function != "take_first":
            raise ValueError(f"unsupported filter {function!r}")
    return out


_PUNCTUATION = str.maketrans("", "", string.punctuation)
_DIGITS = str.maketrans("", "", string.digits)


def exact_match(
    prediction: str,
    reference: str,
    *,
    regexes_to_ignore: Sequence[str] | None = None,
    ignore_case: bool = False,
    ignore_punctuation: bool = False,
    ignore_numbers: bool = False,
    compile_pattern: Compiler = re.compile,
) -> bool:
    """lm-eval's exact_match for one prediction (numpy string semantics: trailing NULs do not
    count)."""
    for pattern in regexes_to_ignore or ():
        compiled = compile_pattern(pattern)
        prediction = compiled.sub("", prediction)
        reference = compiled.sub("", reference)
    if ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    if ignore_punctuation:
        prediction, reference = prediction.translate(_PUNCTUATION), reference.translate(_PUNCTUATION)
    if ignore_numbers:
        prediction, reference = prediction.translate(_DIGITS), reference.translate(_DIGITS)
    return prediction.rstrip("\x00") == reference.rstrip("\x00")


MAX_PIPELINES = 16  # lm-eval's own tasks have one to three
MAX_STEPS = 16
_METRIC_FLAGS = ("ignore_case", "ignore_punctuation", "ignore_numbers")


def meta_problem(meta: Any) -> str | None:
    """Why an item's `meta.lm_eval` cannot be graded by `grade` (its filters and metric
    options as the task reader writes them; a dataset from elsewhere may hold anything), or
    None."""
    if not isinstance(meta, dict):
        return "no meta.lm_eval (the filters and exact_match options `evalctl submit --task` writes)"
    pipelines = meta.get("filters")
    if pipelines is not None:
        if not isinstance(pipelines, list) or not 1 <= len(pipelines) <= MAX_PIPELINES:
            return f"meta.lm_eval.filters must be a list of 1..{MAX_PIPELINES} filter pipelines"
        for i, pipeline in enumerate(pipelines):
            steps = pipeline.get("filter") if isinstance(pipeline, dict) else None
            if (
                not isinstance(steps, list)
                or len(steps) > MAX_STEPS
                or not isinstance(pipeline.get("name", ""), str)
            ):
                return f"meta.lm_eval.filters[{i}]: expected {{name, filter: [at most {MAX_STEPS} steps]}}"
            for j, step in enumerate(steps):
                if problem := _step_problem(step):
                    return f"meta.lm_eval.filters[{i}].filter[{j}]: {problem}"
    metric = meta.get("metric")
    if metric is None:
        return None
    if not isinstance(metric, dict) or metric.get("metric", "exact_match") != "exact_match":
        return "meta.lm_eval.metric must be exact_match's options"
    if any(not isinstance(metric.get(flag, False), bool) for flag in _METRIC_FLAGS):
        return f"meta.lm_eval.metric: {', '.join(_METRIC_FLAGS)} must be true or false"
    ignore = metric.get("regexes_to_ignore") or []
    if not isinstance(ignore, list) or len(ignore) > MAX_STEPS or not all(isinstance(p, str) for p in ignore):
        return f"meta.lm_eval.metric.regexes_to_ignore must be a list of at most {MAX_STEPS} patterns"
    return next(
        (f"meta.lm_eval.metric.regexes_to_ignore: {p}" for p in map(pattern_problem, ignore) if p), None
    )


def _step_problem(step: Any) -> str | None:
    if not isinstance(step, dict) or step.get("function") not in ("regex", "take_first"):
        return "only lm-eval's regex and take_first filters"
    if step["function"] == "take_first":
        return None
    pattern = step.get("regex_pattern", DEFAULT_PATTERN)
    if not isinstance(pattern, str):
        return "regex_pattern must be a string"
    group = step.get("group_select", 0)
    if isinstance(group, bool) or not isinstance(group, int):
        return "group_select must be an integer"
    if not isinstance(step.get("fallback", "[invalid]"), str):
        return "fallback must be a string"
    return pattern_problem(pattern)


@dataclass(frozen=True)
class FilteredGrade:
    """Per filter pipeline: its name, the filtered answer and whether it matches the gold."""

    name: str
    extracted: str
    correct: bool


def grade(
    response: str, meta: dict[str, Any], gold: str, compile_pattern: Compiler = re.compile
) -> list[FilteredGrade]:
    """Every filter pipeline of an item's `meta.lm_eval` applied to `response` and scored
    with its exact_match options; the first is the item's grade."""
    options = dict(meta.get("metric") or {})
    options.pop("metric", None)
    out = []
    for pipeline in meta.get("filters") or [{"name": "none", "filter": [{"function": "take_first"}]}]:
        extracted = apply_pipeline(response, pipeline.get("filter", []), compile_pattern)
        correct = exact_match(
            extracted,
            gold,
            regexes_to_ignore=options.get("regexes_to_ignore"),
            ignore_case=bool(options.get("ignore_case", False)),
            ignore_punctuation=bool(options.get("ignore_punctuation", False)),
            ignore_numbers=bool(options.get("ignore_numbers", False)),
            compile_pattern=compile_pattern,
        )
        out.append(FilteredGrade(str(pipeline.get("name", "")), extracted, correct))
    return out


# ---- a result's `detail`: every pipeline's answer, for the run summary's per-filter metrics


class FilterResult(msgspec.Struct, frozen=True):
    """One filter pipeline's answer in an lm_eval result's `detail` (its text clipped to fit)."""

    name: str
    extracted: str
    correct: bool


class FilterDetail(msgspec.Struct, frozen=True):
    filters: list[FilterResult]


def encode_detail(grades: Sequence[FilteredGrade], max_chars: int) -> str:
    """The pipelines' answers as a result's `detail` (JSON: {"filters": [{name, extracted,
    correct}]}) within `max_chars`: the extracted texts clipped shorter until the whole fits
    (names and verdicts are what the run summary reads)."""
    text = ""
    for clip in (400, 100, 20, 0):
        results = [FilterResult(g.name[:100], g.extracted[:clip], g.correct) for g in grades]
        text = msgspec.json.encode(FilterDetail(results)).decode()
        if len(text) <= max_chars:
            break
    return text


_decode_detail = msgspec.json.Decoder(FilterDetail).decode


def detail_results(detail: str | None) -> list[FilterResult] | None:
    """The pipelines' answers of an lm_eval result's `detail`, or None for any other text."""
    if not detail:
        return None
    try:
        return _decode_detail(detail).filters
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def filter_counts(details: Iterable[str | None]) -> dict[str, tuple[int, int]]:
    """pipeline name -> (items it got right, items graded), over the `detail` of each graded
    item of an lm_eval run, pipelines in the order the results name them (lm-eval reports
    exact_match per filter: gsm8k's strict-match and flexible-extract)."""
    counts: dict[str, list[int]] = {}
    for detail in details:
        for result in detail_results(detail) or []:
            row = counts.setdefault(result.name, [0, 0])
            row[0] += result.correct
            row[1] += 1
    return {name: (right, n) for name, (right, n) in counts.items()}
