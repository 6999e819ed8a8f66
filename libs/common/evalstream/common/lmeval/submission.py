"""A rendered lm-eval task as an evalstream job and dataset (what `evalctl submit --task`
publishes): one run per task, its items the dataset, its generation settings and grader
the job's, its YAML files the job's `task` (recorded in the run manifest)."""

from __future__ import annotations

import io
from typing import Any

import msgspec

from evalstream.common.datasets import write_stored_copy
from evalstream.common.graders import GRADERS
from evalstream.common.lmeval import GENERATION_GRADER, RenderedTask
from evalstream.common.messages import GenerationParams, Item, JobSpec

RAW_PROMPT_WARNING = (
    "workers render a generated prompt through the model's chat template (there is no raw "
    "prompt mode yet), where lm-eval sends the raw context: answers can differ from lm-eval's"
)


def dataset_bytes(items: list[Item]) -> bytes:
    """The items as a JSONL dataset (what is uploaded; it loads back to the same items)."""
    buf = io.BytesIO()
    write_stored_copy(items, buf)
    return buf.getvalue()


def generation_grader(task: RenderedTask) -> tuple[str, list[str]]:
    """The grader of a generate_until task's run, and warnings: `lm_eval` (lm-eval's filters
    and exact_match) where it is registered, else the nearest existing one, named as such."""
    if GENERATION_GRADER in GRADERS:
        return GENERATION_GRADER, []
    first: dict[str, Any] = task.filters[0] if task.filters else {"name": "none", "filter": []}
    regex: dict[str, Any] | None = next((s for s in first["filter"] if s.get("function") == "regex"), None)
    grader = f"regex:{regex['regex_pattern']}" if regex is not None else "exact"
    others = [f["name"] for f in task.filters[1:]]
    return grader, [
        f"{task.name}: the worker has no {GENERATION_GRADER!r} grader yet (lm-eval's filters and "
        f"exact_match): graded with {grader!r} instead, filter {first['name']!r} approximated "
        "(evalstream's regex takes the last match and compares normalised text; lm-eval's takes "
        f"match {regex['group_select'] if regex else 0} and compares with the task's exact_match options)"
        + (f"; filters {', '.join(others)} are not graded" if others else "")
        + f". Each item keeps lm-eval's filters in meta.lm_eval: `evalctl regrade RUN --grader {GENERATION_GRADER}` "
        "grades them exactly once the grader exists"
    ]


def task_job(task: RenderedTask, base: JobSpec, *, grader: str | None = None) -> tuple[JobSpec, list[str]]:
    """The job of one task's run: `base` (model, sharding, retries, name, ...) with the task's
    grader, generation settings and source. `grader` overrides a generate_until task's."""
    warnings = list(task.notes)
    if task.output_type == "generate_until":
        chosen, why = (grader, []) if grader else generation_grader(task)
        warnings += why
        warnings.append(f"{task.name}: {RAW_PROMPT_WARNING}")
        assert task.generation is not None
        generation = msgspec.structs.replace(task.generation, seed=base.generation.seed)
    else:
        chosen = task.grader
        generation = GenerationParams(seed=base.generation.seed)  # scored, not generated
    job = msgspec.structs.replace(
        base,
        grader=chosen,
        generation=generation,
        prompt_template=None,
        system_prompt=None,
        name=base.name or task.name,
        task=task.source,
    )
    return job, warnings
