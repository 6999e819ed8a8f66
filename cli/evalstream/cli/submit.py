"""`evalctl submit DATASET`: validate the dataset and the job completely, upload, publish."""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import sys
from pathlib import Path

import msgspec

from evalstream.cli.common import (
    EXIT_REJECTED,
    fail,
    out_json,
    print_report,
    wait_for_run,
)
from evalstream.cli.trackers import export_on_completion
from evalstream.common import intake_limits, storage
from evalstream.common.datasets import DatasetError, scan_dataset
from evalstream.common.datasets.parts import CheckingFailed
from evalstream.common.jobs import job_problems, new_run_id, publish_job
from evalstream.common.lmeval import DEFAULT_FEWSHOT_SEED, TaskError
from evalstream.common.lmeval.isolation import read_tasks_isolated
from evalstream.common.lmeval.submission import dataset_bytes, task_job
from evalstream.common.messages import GenerationParams, JobSpec, RetryPolicy
from evalstream.common.settings import Settings
from evalstream.common.specs import DEFAULT_MODEL

CHECK_IN_PARTS_BYTES = 64 * 1024 * 1024


async def cmd_submit(args: argparse.Namespace, settings: Settings) -> None:
    if args.export and not args.wait:
        fail("--export exports the run when it completes: it needs --wait")
    if (args.dataset is None) == (args.task is None):
        fail(
            "give a DATASET or --task PATH (an lm-eval task YAML, group YAML or folder), not both",
            EXIT_REJECTED,
        )
    if args.task is not None:
        return await submit_tasks(args, settings)
    path = Path(args.dataset)
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", EXIT_REJECTED)
    job = JobSpec(
        dataset="(pending upload)",
        model=args.model,
        grader=args.grader or "auto",
        generation=GenerationParams(
            max_tokens=args.max_tokens or 256, temperature=args.temperature or 0.0, seed=args.seed
        ),
        prompt_template=args.prompt_template,
        system_prompt=args.system_prompt,
        shard_size=args.shard_size,
        retry=RetryPolicy(max_attempts=args.max_attempts),
        name=args.name or path.name,
        worker_group=args.worker_group,
        sla_fallback=args.sla_fallback,
    )
    run_id, total = await upload_and_publish(settings, job, data, path.name)
    if not args.wait:
        if args.json:
            out_json({"run_id": run_id, "status": "submitted", "total": total})
        else:
            print(run_id)
        return
    summary = await wait_for_run(settings, run_id, timeout=args.timeout, quiet=args.json)
    if args.export:  # opt-in: the completed run goes to the trackers named, with their defaults
        await export_on_completion(settings, run_id, args.export)
    if args.json:
        out_json(summary)
    else:
        print_report(summary)


async def upload_and_publish(settings: Settings, job: JobSpec, data: bytes, filename: str) -> tuple[str, int]:
    """Validates the job and the dataset completely (the user hears about a bad line in a
    second, and nothing is uploaded), uploads the dataset, publishes the job: (run id, items)."""
    problems = [str(p) for p in job_problems(job)]
    try:
        # the producer's limit: an item must fit in a shard message beside the job's fields
        item_limit = intake_limits.max_item_bytes(job)
        # checked as the producer checks it, items counted and not kept (a big set's items,
        # held all at once, would take several times the file's size)
        scanned = await asyncio.to_thread(
            scan_dataset,
            io.BytesIO(data),
            filename,
            max_item_bytes=item_limit,
            # a command starts its checking processes for itself: worth it for a large file
            # only (150,000 short items, 10.9 MB, took 1.0-1.05 s in one process and 1.24-1.27 s
            # in two when evalctl's code runs inside a bigger program, whose main module
            # each child imports again)
            processes=settings.dataset_check_processes if len(data) >= CHECK_IN_PARTS_BYTES else 1,
        )
    except DatasetError as exc:
        problems += [str(p) for p in exc.problems]
    except CheckingFailed as exc:
        fail(f"cannot check {filename}: {exc}")
    if problems:
        shown = "\n  ".join(problems[:30]) + (
            f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        )
        fail(f"rejected {filename}: {len(problems)} problem(s)\n  {shown}", EXIT_REJECTED)
    for w in scanned.warnings:
        print(f"evalctl: warning: {w}", file=sys.stderr)
    key = f"uploads/{scanned.sha256}/{filename}"
    s3 = storage.client(settings)
    await asyncio.to_thread(
        storage.put_bytes, s3, settings.s3_bucket_datasets, key, data, "application/octet-stream"
    )
    run_id = new_run_id()
    job = msgspec.structs.replace(job, dataset=f"s3://{settings.s3_bucket_datasets}/{key}", run_id=run_id)
    await publish_job(settings, job)
    print(f"submitted {run_id}: {scanned.items} items, model {job.model}", file=sys.stderr)
    return run_id, scanned.items


async def submit_tasks(args: argparse.Namespace, settings: Settings) -> None:
    """`--task PATH`: every task PATH names, rendered as lm-eval renders it, one run each."""
    not_for_tasks = {
        "--max-tokens": args.max_tokens,
        "--temperature": args.temperature,
        "--prompt-template": args.prompt_template,
        "--system-prompt": args.system_prompt,
    }
    given = [flag for flag, value in not_for_tasks.items() if value is not None]
    if given:
        fail(
            f"{', '.join(given)}: a task's YAML sets its prompts and generation (not with --task)",
            EXIT_REJECTED,
        )
    try:
        tasks = await asyncio.to_thread(
            read_tasks_isolated,
            args.task,
            root=args.task_root,
            data_dir=args.data_dir,
            num_fewshot=args.num_fewshot,
            fewshot_seed=args.fewshot_seed,
            limit=args.limit,
            s3=True,
            hub=args.hub,
        )
    except TaskError as exc:
        fail(f"rejected {args.task}: {exc}", EXIT_REJECTED)
    base = JobSpec(
        dataset="(pending upload)",
        model=args.model,
        generation=GenerationParams(seed=args.seed),
        shard_size=args.shard_size,
        retry=RetryPolicy(max_attempts=args.max_attempts),
        name=args.name if len(tasks) == 1 else None,
        worker_group=args.worker_group,
        sla_fallback=args.sla_fallback,
    )
    runs: list[tuple[str, str]] = []  # (task, run id)
    for task in tasks:
        grader = args.grader if args.grader and task.output_type == "generate_until" else None
        if args.grader and grader is None:
            print(
                f"evalctl: warning: {task.name}: --grader applies to generate_until tasks only",
                file=sys.stderr,
            )
        try:
            job, warnings = task_job(task, base, grader=grader)
        except TaskError as exc:
            fail(f"rejected {args.task}: {exc}", EXIT_REJECTED)
        for w in warnings:
            print(f"evalctl: warning: {w}", file=sys.stderr)
        filename = re.sub(r"[^A-Za-z0-9._-]", "_", task.name)[:100] + ".jsonl"  # part of an S3 key
        run_id, _ = await upload_and_publish(settings, job, dataset_bytes(task.items), filename)
        runs.append((task.name, run_id))
    if not args.wait:
        if args.json:
            out_json({"status": "submitted", "runs": [{"task": t, "run_id": r} for t, r in runs]})
        else:
            print("\n".join(r for _, r in runs))
        return
    summaries = []
    for task_name, run_id in runs:
        summary = await wait_for_run(settings, run_id, timeout=args.timeout, quiet=args.json)
        if args.export:
            await export_on_completion(settings, run_id, args.export)
        summaries.append({**summary, "task": task_name})
        if not args.json:
            print_report(summary)
    if args.json:
        out_json(summaries[0] if len(summaries) == 1 else {"runs": summaries})


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "submit",
        help="validate a dataset, upload it and start a run",
        description="Validate DATASET completely (nothing is uploaded if any line is bad), upload it, "
        "and publish the job. Exit code 2 when the dataset or job is rejected.",
    )
    s.add_argument(
        "dataset",
        nargs="?",
        help="JSONL, Parquet or CSV file (id, question|prompt|messages, answer, ...) or HumanEval JSONL",
    )
    t = s.add_argument_group(
        "lm-evaluation-harness tasks",
        "--task PATH runs an lm-eval task YAML as lm-eval 0.4.13 renders it (a group YAML or a "
        "folder: one run per task); anything of the YAML not reproduced is refused with its key",
    )
    t.add_argument("--task", help="an lm-eval task YAML, a group YAML or a folder of task YAMLs")
    t.add_argument(
        "--task-root",
        help="the folder the task's files (includes, data_files, a group's tasks) must lie in "
        "(default: the YAML's folder, or the folder given)",
    )
    t.add_argument(
        "--data-dir",
        help="local copies of hub datasets: DIR/<dataset_path>/<dataset_name>/<split>.jsonl "
        "(or .json, .parquet, .csv); the hub is not read",
    )
    t.add_argument(
        "--num-fewshot", type=int, help="few-shot examples (lm-eval's --num_fewshot; a task's 0 stays 0)"
    )
    t.add_argument(
        "--fewshot-seed",
        type=int,
        default=DEFAULT_FEWSHOT_SEED,
        help=f"the few-shot sampler's seed (lm-eval's --fewshot_random_seed, default {DEFAULT_FEWSHOT_SEED})",
    )
    t.add_argument("--limit", type=int, help="the first N documents of each task (lm-eval's --limit)")
    t.add_argument(
        "--hub",
        action="store_true",
        help="read hub datasets without a local copy from the Hugging Face hub (its Parquet conversion), "
        "where the hub is reachable",
    )
    s.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model SPEC (default {DEFAULT_MODEL}: the bundled SmolLM2-135M-Instruct on each worker's fastest "
        "engine that gives the same answers as hf: fp32 (bench/against_lmeval.py measures it) - ov: (OpenVINO) "
        "on a CPU, several times faster than torch there; hf: (torch) on CUDA - chosen by the worker for its "
        "device, so the SPEC, manifest and reproductions stay the same on any hardware; each result's "
        "served_by and model_revision name the engine that answered). Or: hf:<dir|file.gguf|name> (torch), "
        "ov:<dir|file.gguf|name>[?precision=fp32|fast] (OpenVINO continuous batching, CPU), "
        "openai:<model>@<url>, replay:<file.jsonl>, null",
    )
    s.add_argument(
        "--grader",
        help="how answers are graded (default auto: per item; with --task: the task's)",
    )
    s.add_argument("--max-tokens", type=int, help="maximum new tokens per answer (default 256)")
    s.add_argument("--temperature", type=float, help="sampling temperature (default 0: greedy, cacheable)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--shard-size",
        type=int,
        default=None,
        help="items per shard (default: 32, or more for a set over 8,192 items so that it makes "
        "about 256 shards, at most 256 items each)",
    )
    s.add_argument(
        "--max-attempts", type=int, default=3, help="tries per item before it is dead-lettered (default 3)"
    )
    s.add_argument(
        "--prompt-template", help="template with {question} (and {choices}); default depends on the grader"
    )
    s.add_argument("--system-prompt")
    s.add_argument("--worker-group", help="pin the run to one worker group")
    s.add_argument(
        "--sla-fallback", action="store_true", help="allow a lighter model when the SLA is violated"
    )
    s.add_argument("--name", help="a name for the run (default: the file name)")
    s.add_argument("--wait", action="store_true", help="show progress until the run ends, then the report")
    s.add_argument("--timeout", type=float, help="with --wait: give up waiting after this many seconds")
    s.add_argument(
        "--export",
        action="append",
        choices=("wandb", "mlflow"),
        help="with --wait: when the run completes, export it (`evalctl export --help`); repeatable",
    )
    s.add_argument(
        "--json", action="store_true", help="last stdout line: the run summary (or submission) as JSON"
    )
    s.set_defaults(handler=cmd_submit)
