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

RAW_PROMPT_WARNING = (
    "workers render a generated prompt through the model's chat template (there is no raw "
    "prompt mode yet), where lm-eval sends the raw context: answers can differ from lm-eval's"
)


def dataset_bytes(items: list[Item]) -> bytes:
    """The items as a JSONL dataset (what is uploaded; it loads back to the same items)."""
    buf = io.BytesIO()
    write_stored_copy(items, buf)
    return buf.getvalue()


def generation_grader(task: RenderedTask) -> str:
    """The grader of a generate_until task's run: `lm_eval` (lm-eval's filters and
    exact_match over the raw answer). Where it is not registered yet, the task is refused: the
    existing graders would grade it otherwise (evalstream's regex takes the last match and
    compares normalised text with the whole target, where lm-eval takes the match
    `group_select` names and first applies the metric's regexes_to_ignore to both; gsm8k's
    target is the whole worked solution), so the user chooses one with --grader."""
    if GENERATION_GRADER in GRADERS:
        return GENERATION_GRADER
    raise TaskRefused(
        f"lm-eval grades it with its filters ({', '.join(f['name'] for f in task.filters)}) and "
        f"exact_match, the {GENERATION_GRADER!r} grader, which the workers do not have yet: pass "
        f"--grader to grade with another (the items keep lm-eval's filters in meta.lm_eval; `evalctl "
        f"regrade RUN --grader {GENERATION_GRADER}` grades them as lm-eval once it exists)",
        key="output_type",
        where=task.name,
    )


def task_job(task: RenderedTask, base: JobSpec, *, grader: str | None = None) -> tuple[JobSpec, list[str]]:
    """The job of one task's run: `base` (model, sharding, retries, name, ...) with the task's
    grader, generation settings and source. `grader` overrides a generate_until task's."""
    warnings = list(task.notes)
    if task.output_type == "generate_until":
        chosen = grader or generation_grader(task)
        if grader:
            warnings.append(f"{task.name}: graded with {grader!r}, not lm-eval's filters and exact_match")
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
