"""`evalctl reproduce RUN [--wait]`: a new run from RUN's manifest, compared with RUN.

The reproduction reads the dataset's content-addressed copy in S3 (checked against the
recorded content hash), asks for the same model SPEC, generation parameters and seed,
prompt template, system prompt and grader, and never reads the answer cache, so that the
model really answers again (`--cache` allows it: a re-grade, not a reproduction).

It refuses, naming the reason, when a part of the manifest is no longer available: the
dataset copy is gone or altered, no live worker group serves the model, the grader no longer
exists, or the run used per-grader default templates that have changed since. Differences
that do not stop it (code version, grader version, sampled generation) are warnings. With
--wait it then compares the two runs item by item, their manifest hashes and the model
revisions that actually served them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from evalstream.cli.common import (
    EXIT_REJECTED,
    database,
    fail,
    out_json,
    read_heartbeats,
    run_row,
    wait_for_run,
)
from evalstream.common import fleet, storage
from evalstream.common.analysis.compare import reproduction_report
from evalstream.common.graders import effective_templates, grader_problem, grader_version, graders_for
from evalstream.common.jobs import new_run_id, publish_job
from evalstream.common.manifest import Request, code_version, request_from_manifest
from evalstream.common.messages import GenerationParams, JobSpec, RetryPolicy, TaskSource
from evalstream.common.regrading import StoredCopyError, run_items
from evalstream.common.settings import Settings
from evalstream.common.specs import serves, spec_problem


@dataclass
class Plan:
    job: JobSpec | None  # None when refused
    blockers: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def plan_reproduction(
    run_id: str,
    manifest: dict[str, Any],
    *,
    new_run_id: str,
    dataset_problem: str | None,
    serving_groups: list[str],
    code: dict[str, Any],
    use_cache: bool = False,
) -> Plan:
    """The job that reproduces `run_id`, or why it cannot be reproduced. `dataset_problem`:
    what is wrong with the stored dataset copy; `serving_groups`: live worker groups that
    serve the model; `code`: the code version here."""
    req = request_from_manifest(manifest)
    blockers: list[str] = []
    warnings: list[str] = []
    if dataset_problem:
        blockers.append(dataset_problem)
    if problem := spec_problem(req.model):
        blockers.append(f"model SPEC no longer valid: {problem}")
    elif not serving_groups:
        blockers.append(f"no live worker group serves model {req.model!r} (see `evalctl workers`)")
    template = req.prompt_template
    if problem := grader_problem(req.grader):
        blockers.append(f"grader no longer available: {problem}")
    else:
        if req.grader_version is not None and req.grader_version != grader_version(req.grader):
            warnings.append(
                f"grader version changed: {req.grader_version} -> {grader_version(req.grader)} (grades may differ)"
            )
        if req.templates is not None and req.templates != effective_templates(
            template, graders_for(req.grader)
        ):
            distinct = set(req.templates.values())
            if len(distinct) == 1:  # one template for every item: pass it explicitly
                template = distinct.pop()
                warnings.append(
                    "the default prompt template changed since the run; the original is passed explicitly"
                )
            else:
                changed = sorted(
                    g for g, t in req.templates.items() if effective_templates(template, [g])[g] != t
                )
                blockers.append(
                    f"the default prompt templates of {', '.join(changed)} changed since the run, and a "
                    f"{req.grader!r} run cannot be given per-grader templates"
                )
    if code != req.code:
        warnings.append(f"code version differs: run {_code(req.code)}, here {_code(code)}")
    if req.generation.get("temperature", 0.0) > 0:
        warnings.append(
            f"sampled generation (temperature {req.generation['temperature']}): answers need not be identical"
        )
    if req.sla_fallback:
        warnings.append("the run allowed an SLA fallback model; the reproduction does not")
    if blockers:
        return Plan(None, blockers, warnings)
    job = JobSpec(
        dataset=req.dataset_uri,
        model=req.model,
        grader=req.grader,
        generation=GenerationParams(**req.generation),
        prompt_template=template,
        system_prompt=req.system_prompt,
        shard_size=req.shard_size,
        retry=RetryPolicy(**req.retry),
        name=f"reproduce {run_id}",
        run_id=new_run_id,
        bypass_cache=not use_cache,
        # the lm-eval task the items were rendered from (the items are the stored copy's)
        task=msgspec.convert(req.task, TaskSource) if req.task is not None else None,
        raw_prompt=req.raw_prompt,
    )
    return Plan(job, blockers, warnings)


def _code(c: dict[str, Any]) -> str:
    commit = (c.get("git_commit") or "unknown")[:12]
    return f"{c.get('package')} {commit}{' (dirty)' if c.get('git_dirty') else ''}"


# --------------------------------------------------------------------------- facts


async def dataset_problem(settings: Settings, req: Request) -> str | None:
    """Why the stored dataset copy cannot be used, or None."""
    try:
        await asyncio.to_thread(run_items, storage.client(settings), req)
    except StoredCopyError as exc:
        return str(exc)
    return None


async def serving_groups(settings: Settings, model: str) -> list[str]:
    """Worker groups with a live member whose advertised models include `model`."""

    now = time.time()
    return sorted(
        {
            hb.group
            for hb in await read_heartbeats(settings)
            if fleet.is_live(hb, now, settings.router_heartbeat_timeout_s) and serves(hb.model, model)
        }
    )


# --------------------------------------------------------------------------- output


def print_reproduction(r: dict[str, Any]) -> None:
    acc, man, rev = r["accuracy"], r["manifest_sha256"], r["served_revisions"]
    verdict = "reproduced exactly" if r["all_identical"] and acc["delta"] == 0 else "NOT reproduced exactly"
    print(f"{r['reproduction']} reproduces {r['original']}: {verdict}")
    print(f"  identical answers {r['identical_answers']}/{r['items']}")
    if acc["original"] is not None:
        print(f"  accuracy {acc['original']:.1%} -> {acc['reproduction']:.1%} (delta {acc['delta']:+.1%})")
    print(
        f"  answers from the cache: original {r['cache_hits']['original']}, reproduction {r['cache_hits']['reproduction']}"
    )
    print(
        f"  manifest {'identical' if man['identical'] else 'differs: ' + ', '.join(man['differences'])}"
        f" ({(man['reproduction'] or '')[:12]})"
    )
    print(f"  served revisions {'identical' if rev['identical'] else 'differ'}: {rev['reproduction']}")
    changed = r["comparison"]["answer_changed"]
    if changed:
        print(f"  changed answers: {', '.join(changed[:10])}{' ...' if len(changed) > 10 else ''}")


# --------------------------------------------------------------------------- command


async def cmd_reproduce(args: argparse.Namespace, settings: Settings) -> None:

    async with database(settings) as conn:
        run = await run_row(conn, args.run)
    if run["manifest"] is None:
        fail(f"run {args.run} has no manifest (status {run['status']}): nothing to reproduce", EXIT_REJECTED)
    manifest = json.loads(run["manifest"])
    req = request_from_manifest(manifest)
    run_id = new_run_id()
    plan = plan_reproduction(
        args.run,
        manifest,
        new_run_id=run_id,
        dataset_problem=await dataset_problem(settings, req),
        serving_groups=await serving_groups(settings, req.model),
        code=code_version(),
        use_cache=args.cache,
    )
    for w in plan.warnings:
        print(f"evalctl: warning: {w}", file=sys.stderr)
    if plan.job is None:
        fail(f"cannot reproduce {args.run}:\n  " + "\n  ".join(plan.blockers), EXIT_REJECTED)
    assert plan.job is not None
    await publish_job(settings, plan.job)
    print(f"submitted {run_id}: reproduction of {args.run}, model {req.model}", file=sys.stderr)
    if not args.wait:
        if args.json:
            out_json(
                {
                    "original": args.run,
                    "reproduction": run_id,
                    "status": "submitted",
                    "warnings": plan.warnings,
                }
            )
        else:
            print(run_id)
            print(f"compare when it is done: evalctl compare {args.run} {run_id}", file=sys.stderr)
        return
    await wait_for_run(settings, run_id, timeout=args.timeout, quiet=args.json)
    async with database(settings) as conn:
        report = await reproduction_report(conn, args.run, run_id)
    report["warnings"] = plan.warnings
    if args.json:
        out_json(report)
    else:
        print_reproduction(report)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "reproduce",
        help="a new run from a run's manifest, compared with it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run")
    p.add_argument(
        "--wait", action="store_true", help="wait for the new run, then compare it with the original"
    )
    p.add_argument("--timeout", type=float, help="with --wait: give up waiting after this many seconds")
    p.add_argument(
        "--cache", action="store_true", help="allow answers from the answer cache (a re-grade only)"
    )
    p.add_argument(
        "--json", action="store_true", help="last stdout line: the comparison (or submission) as JSON"
    )
    p.set_defaults(handler=cmd_reproduce)
