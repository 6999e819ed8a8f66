"""What a task or group YAML becomes once checked (TaskConfig, GroupConfig and their parts), and
lm-eval 0.4.13's keys: which are reproduced, inert or refused (lm_eval/config/task.py TaskConfig
and FewshotConfig, api/task.py ConfigurableTask). Defaults are lm-eval's. The checking itself:
parse.py (a whole task or group) and sections.py (each section of a task)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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


@dataclass(frozen=True)
class GroupConfig:
    group: str
    members: tuple[str | dict[str, Any], ...]
    overrides: dict[str, Any]  # task keys set for every member (lm-eval's group-level overrides)
    aggregate_metric_list: tuple[dict[str, Any], ...] = ()
