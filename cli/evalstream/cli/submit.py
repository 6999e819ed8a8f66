"""`evalctl submit DATASET`: validate the dataset and the job completely, upload, publish."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import msgspec

from evalstream.cli import export
from evalstream.cli.common import (
    EXIT_REJECTED,
    fail,
    out_json,
    print_report,
    wait_for_run,
)
from evalstream.common import intake_limits, storage
from evalstream.common.datasets import DatasetError, load_dataset
from evalstream.common.jobs import job_problems, new_run_id, publish_job
from evalstream.common.messages import GenerationParams, JobSpec, RetryPolicy
from evalstream.common.settings import Settings
from evalstream.common.specs import DEFAULT_MODEL


async def cmd_submit(args: argparse.Namespace, settings: Settings) -> None:
    if args.export and not args.wait:
        fail("--export exports the run when it completes: it needs --wait")
    path = Path(args.dataset)
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", EXIT_REJECTED)
    job = JobSpec(
        dataset="(pending upload)",
        model=args.model,
        grader=args.grader,
        generation=GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed),
        prompt_template=args.prompt_template,
        system_prompt=args.system_prompt,
        shard_size=args.shard_size,
        retry=RetryPolicy(max_attempts=args.max_attempts),
        name=args.name or path.name,
        worker_group=args.worker_group,
        sla_fallback=args.sla_fallback,
    )
    # Validate here first: the user hears about a bad line in a second, and nothing is uploaded.
    problems = [str(p) for p in job_problems(job)]
    try:
        # the producer's limit: an item must fit in a shard message beside the job's fields
        item_limit = intake_limits.max_item_bytes(job)
        loaded = await asyncio.to_thread(load_dataset, data, path.name, max_item_bytes=item_limit)
    except DatasetError as exc:
        problems += [str(p) for p in exc.problems]
    if problems:
        shown = "\n  ".join(problems[:30]) + (
            f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        )
        fail(f"rejected {path}: {len(problems)} problem(s)\n  {shown}", EXIT_REJECTED)
    for w in loaded.warnings:
        print(f"evalctl: warning: {w}", file=sys.stderr)
    key = f"uploads/{loaded.sha256}/{path.name}"
    s3 = storage.client(settings)
    await asyncio.to_thread(
        storage.put_bytes, s3, settings.s3_bucket_datasets, key, data, "application/octet-stream"
    )
    run_id = new_run_id()
    job = msgspec.structs.replace(job, dataset=f"s3://{settings.s3_bucket_datasets}/{key}", run_id=run_id)
    await publish_job(settings, job)
    print(f"submitted {run_id}: {len(loaded.items)} items, model {job.model}", file=sys.stderr)
    if not args.wait:
        if args.json:
            out_json({"run_id": run_id, "status": "submitted", "total": len(loaded.items)})
        else:
            print(run_id)
        return
    summary = await wait_for_run(settings, run_id, timeout=args.timeout, quiet=args.json)
    if args.export:  # opt-in: the completed run goes to the trackers named, with their defaults
        await export.export_on_completion(settings, run_id, args.export)
    if args.json:
        out_json(summary)
    else:
        print_report(summary)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "submit",
        help="validate a dataset, upload it and start a run",
        description="Validate DATASET completely (nothing is uploaded if any line is bad), upload it, "
        "and publish the job. Exit code 2 when the dataset or job is rejected.",
    )
    s.add_argument(
        "dataset",
        help="JSONL, Parquet or CSV file (id, question|prompt|messages, answer, ...) or HumanEval JSONL",
    )
    s.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model SPEC (default {DEFAULT_MODEL}): hf:<dir|file.gguf|name>, "
        "ov:<dir|file.gguf|name>[?precision=fp32|fast] (OpenVINO continuous batching, CPU), "
        "openai:<model>@<url>, replay:<file.jsonl>, null",
    )
    s.add_argument(
        "--grader",
        default="auto",
        help="how answers are graded (default auto: per item)",
    )
    s.add_argument("--max-tokens", type=int, default=256, help="maximum new tokens per answer (default 256)")
    s.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy, cacheable)"
    )
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
