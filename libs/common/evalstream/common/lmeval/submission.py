"""A rendered lm-eval task as an evalstream job and dataset (what `evalctl submit --task`
publishes): one run per task, its items the dataset, its generation settings and grader
the job's, its YAML files the job's `task` (recorded in the run manifest)."""

from __future__ import annotations

import io

import msgspec

from evalstream.common.datasets import write_stored_copy
from evalstream.common.graders import GRADERS
from evalstream.common.lmeval import GENERATION_GRADER, RenderedTask, TaskRefused
from evalstream.common.messages import GenerationParams, Item, JobSpec


def dataset_bytes(items: list[Item]) -> bytes:
    """The items as a JSONL dataset (what is uploaded; it loads back to the same items)."""
    buf = io.BytesIO()
    write_stored_copy(items, buf)
    return buf.getvalue()


def generation_grader(task: RenderedTask) -> str:
    """The grader of a generate_until task's run: `lm_eval` (lm-eval's filters and
    exact_match over the raw answer, evalstream.common.lmeval_filters). Where a registry
    lacks it the task is refused rather than graded otherwise (evalstream's regex takes the
    last match and compares normalised text with the whole target, where lm-eval takes the
    match `group_select` names and first applies the metric's regexes_to_ignore to both), so
    the user chooses one with --grader."""
    if GENERATION_GRADER in GRADERS:
        return GENERATION_GRADER
    raise TaskRefused(
        f"lm-eval grades it with its filters ({', '.join(f['name'] for f in task.filters)}) and "
        f"exact_match, the {GENERATION_GRADER!r} grader, which this registry lacks: pass --grader "
        "to grade with another",
        key="output_type",
        where=task.name,
    )


def task_job(task: RenderedTask, base: JobSpec, *, grader: str | None = None) -> tuple[JobSpec, list[str]]:
    """The job of one task's run: `base` (model, sharding, retries, name, ...) with the task's
    grader, generation settings and source, its prompts raw (each item's question is lm-eval's
    context, sent as it is: no template, system prompt or chat template). `grader` overrides a
    generate_until task's."""
    warnings = list(task.notes)
    if task.output_type == "generate_until":
        chosen = grader or generation_grader(task)
        if grader:
            warnings.append(f"{task.name}: graded with {grader!r}, not lm-eval's filters and exact_match")
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
        raw_prompt=True,
    )
    return job, warnings
