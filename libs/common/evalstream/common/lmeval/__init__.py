"""lm-evaluation-harness task configs as they are: a task YAML (or a group YAML, or a folder
of them) and its local data rendered into evalstream items exactly as lm-eval 0.4.13 renders
its requests, so that `evalctl submit --task` runs the task.

Item format (one item per document of the evaluation split; its id is lm-eval's doc_id, the
document's index in that split):

* multiple_choice: grader `loglikelihood`; `question` the whole raw context (description,
  few-shot examples, the document's text; no chat template), `choices` the continuations
  without the target delimiter, `answer` the gold choice's index ("2"),
  `meta.lm_eval = {"target_delimiter", "output_type": "multiple_choice", "task"}`.
* loglikelihood: grader `loglikelihood`, one choice (the target, as lm-eval scores it), answer
  "0", `meta.lm_eval.target_delimiter` "" (lm-eval inserts none for this output type).
* loglikelihood_rolling: grader `perplexity`, `question` the document (doc_to_target), answer
  "n/a" (the dataset format needs one; nothing reads it).
* generate_until: grader `lm_eval` (lm-eval's filters and exact_match,
  evalstream.common.lmeval_filters) where the worker has it; `question` the raw context,
  `answer` the target; `meta.lm_eval` adds `filters` (the task's filter_list) and `metric`
  (its exact_match options). `until` is the job's stop strings, `max_gen_toks` its max_tokens.

The YAML is untrusted: read by yamlfiles (safe loader, no `!function`, includes inside the
task root), rendered by templates (Jinja in an immutable sandbox, bounded), and, from the CLI,
in a child process with time and memory limits (isolation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalstream.common.lmeval.config import OutputType, TaskConfig
from evalstream.common.lmeval.data import DataSource, Fetch, load_splits
from evalstream.common.lmeval.errors import TaskDataError, TaskError, TaskRefused
from evalstream.common.lmeval.hub import Hub
from evalstream.common.lmeval.render import DEFAULT_FEWSHOT_SEED, TaskRenderer
from evalstream.common.lmeval.tasks import ResolvedTask, resolve
from evalstream.common.lmeval.yamlfiles import files_sha256
from evalstream.common.messages import GenerationParams, Item, TaskFile, TaskSource

__all__ = [
    "DEFAULT_FEWSHOT_SEED",
    "GENERATION_GRADER",
    "READER",
    "RenderedTask",
    "TaskDataError",
    "TaskError",
    "TaskRefused",
    "grader_for",
    "read_tasks",
    "task_sha256",
]

READER = "lm-eval-0.4.13/1"  # bump when a change can change a rendered item
GENERATION_GRADER = "lm_eval"  # lm-eval's filters + exact_match (evalstream.common.lmeval_filters)
SCORING_GRADERS: dict[str, str] = {
    "multiple_choice": "loglikelihood",
    "loglikelihood": "loglikelihood",
    "loglikelihood_rolling": "perplexity",
    "generate_until": GENERATION_GRADER,
}


def grader_for(output_type: OutputType) -> str:
    return SCORING_GRADERS[output_type]


def task_sha256(files: list[TaskFile]) -> str:
    return files_sha256({f.path: f.text for f in files})


@dataclass(frozen=True)
class RenderedTask:
    name: str
    output_type: OutputType
    items: list[Item]
    grader: str
    generation: GenerationParams | None  # generate_until: until, max_gen_toks, sampling
    source: TaskSource
    metrics: list[dict[str, Any]]
    filters: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def _needed_splits(cfg: TaskConfig, num_fewshot: int) -> set[str]:
    needed = {cfg.test_split if cfg.test_split is not None else cfg.validation_split}
    fs = cfg.fewshot
    if num_fewshot > 0:
        if fs.split is not None:
            needed.add(fs.split)
        elif fs.samples is None:
            needed.add(cfg.training_split or cfg.validation_split or cfg.test_split)
    return {s for s in needed if s is not None}


def render_task(
    task: ResolvedTask,
    *,
    roots: tuple[Path, ...],
    data_dir: Path | None = None,
    num_fewshot: int | None = None,
    fewshot_seed: int = DEFAULT_FEWSHOT_SEED,
    limit: int | None = None,
    fetch: Fetch | None = None,
    hub: Hub | None = None,
) -> RenderedTask:
    cfg = task.config
    shots = cfg.num_fewshot if num_fewshot is None or cfg.num_fewshot == 0 else num_fewshot
    src = DataSource(task.yaml_dir, roots, data_dir, fetch, hub)
    try:
        splits = load_splits(cfg, _needed_splits(cfg, shots or 0), src)
        rendered = TaskRenderer(cfg, splits, num_fewshot=num_fewshot, seed=fewshot_seed).render(limit)
    except TaskError as exc:
        exc.where = exc.where or cfg.task
        raise
    files = [TaskFile(p, t) for p, t in task.files.items()]
    source = TaskSource(
        name=cfg.task,
        files=files,
        sha256=task_sha256(files),
        reader=READER,
        num_fewshot=rendered.num_fewshot,
        fewshot_seed=fewshot_seed,
        group=task.group,
    )
    generation = None
    if cfg.generation is not None:
        g = cfg.generation
        generation = GenerationParams(
            max_tokens=g.max_gen_toks, temperature=g.temperature, top_p=g.top_p, stop=list(g.until)
        )
    return RenderedTask(
        name=cfg.task,
        output_type=cfg.output_type,
        items=rendered.items,
        grader=grader_for(cfg.output_type),
        generation=generation,
        source=source,
        metrics=[m.as_dict() for m in cfg.metrics],
        filters=[f.as_dict() for f in cfg.filters] if cfg.output_type == "generate_until" else [],
        notes=rendered.notes,
    )


def read_tasks(
    path: str | Path,
    *,
    root: str | Path | None = None,
    data_dir: str | Path | None = None,
    num_fewshot: int | None = None,
    fewshot_seed: int = DEFAULT_FEWSHOT_SEED,
    limit: int | None = None,
    fetch: Fetch | None = None,
    hub: Hub | None = None,
    on_task: Callable[[RenderedTask], None] | None = None,
) -> list[RenderedTask]:
    """Every task `path` names (a task YAML, a group YAML, a folder), rendered. Raises
    TaskRefused / TaskDataError / TaskError naming what is wrong."""
    tasks, notes = resolve(Path(path), Path(root) if root is not None else None)
    base = Path(root) if root is not None else (Path(path) if Path(path).is_dir() else Path(path).parent)
    roots = tuple(p.expanduser().resolve() for p in (base, *([Path(data_dir)] if data_dir else [])))
    out = []
    for i, task in enumerate(tasks):
        rendered = render_task(
            task,
            roots=roots,
            data_dir=Path(data_dir).expanduser().resolve() if data_dir else None,
            num_fewshot=num_fewshot,
            fewshot_seed=fewshot_seed,
            limit=limit,
            fetch=fetch,
            hub=hub,
        )
        if i == 0 and notes:
            rendered.notes.extend(f"not a task, skipped: {n}" for n in notes)
        if on_task is not None:
            on_task(rendered)
        out.append(rendered)
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise TaskRefused(f"a task appears twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return out
