"""evalctl: submit evaluation runs and read their results.

Commands talk to Kafka (submitting, redriving), the S3 store (uploading datasets) and
PostgreSQL (progress, results, reports), configured by the same environment variables as
the services (KAFKA_BOOTSTRAP, DATABASE_URL, S3_ENDPOINT, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import urllib3
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from minio.error import MinioException

from evalstream.cli import extensions
from evalstream.cli.audit import THRESHOLD as AUDIT_THRESHOLD
from evalstream.cli.audit import accuracy_without_flagged, probability
from evalstream.cli.datasets_cmd import DatasetRefError
from evalstream.cli.progress import ProgressBar
from evalstream.common import intake_limits, report_html, storage, telemetry, topics
from evalstream.common.lag import group_lag, topic_partitions
from evalstream.common.messages import (
    GenerationParams,
    Heartbeat,
    Item,
    JobSpec,
    RetryPolicy,
    Shard,
    decode,
    encode,
)
from evalstream.common.reports import summarise
from evalstream.common.settings import Settings
from evalstream.common.specs import DEFAULT_MODEL

EXIT_REJECTED = 2
EXIT_FAILED = 1


def fail(message: str, code: int = EXIT_FAILED) -> None:
    print(f"evalctl: {message}", file=sys.stderr)
    raise SystemExit(code)


def out_json(value: Any) -> None:
    print(json.dumps(value, default=str, sort_keys=True))


# --------------------------------------------------------------------------- submit


async def cmd_submit(args: argparse.Namespace, settings: Settings) -> None:
    if args.export and not args.wait:
        fail("--export exports the run when it completes: it needs --wait")
    from evalstream.producer.datasets import DatasetError, load_dataset
    from evalstream.producer.intake import job_problems

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
    run_id = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    job = msgspec.structs.replace(job, dataset=f"s3://{settings.s3_bucket_datasets}/{key}", run_id=run_id)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True
    )
    telemetry.setup("evalctl")
    await producer.start()
    try:
        # The run's trace starts here: its context travels in the job's headers.
        with telemetry.send_span(topics.JOBS, run_id) as headers:
            await producer.send_and_wait(topics.JOBS, encode(job), key=run_id.encode(), headers=headers)
    finally:
        await producer.stop()
        telemetry.shutdown()
    print(f"submitted {run_id}: {len(loaded.items)} items, model {job.model}", file=sys.stderr)
    if not args.wait:
        if args.json:
            out_json({"run_id": run_id, "status": "submitted", "total": len(loaded.items)})
        else:
            print(run_id)
        return
    summary = await wait_for_run(settings, run_id, timeout=args.timeout, quiet=args.json)
    if args.export:  # opt-in: the completed run goes to the trackers named, with their defaults
        from evalstream.cli import export

        await export.export_on_completion(settings, run_id, args.export)
    if args.json:
        out_json(summary)
    else:
        print_report(summary)


async def wait_for_run(
    settings: Settings, run_id: str, *, timeout: float | None, quiet: bool
) -> dict[str, Any]:
    conn = await asyncpg.connect(settings.database_url)
    bar = ProgressBar(run_id)
    deadline = time.monotonic() + timeout if timeout else None
    try:
        while True:
            row = await conn.fetchrow(
                # `recorded` is kept by the aggregator: no count over the run's rows
                "SELECT status, total, problems, recorded AS done, (SELECT count(*) FROM dead_letters d"
                " WHERE d.run_id = r.run_id AND d.redriven_at IS NULL) AS failed FROM runs r WHERE run_id = $1",
                run_id,
            )
            if row is not None and row["status"] == "rejected":
                bar.close()
                problems = json.loads(row["problems"] or "[]")
                lines = "\n  ".join(_problem_text(p) for p in problems[:30])
                fail(
                    f"run {run_id} rejected by the producer: {len(problems)} problem(s)\n  {lines}",
                    EXIT_REJECTED,
                )
            if row is not None and row["status"] == "completed":
                bar.update(row["done"], row["total"], f"failed {row['failed']}")
                bar.close()
                return await summarise(conn, run_id)
            status = row["status"] if row else "queued"
            bar.update(
                row["done"] if row else 0,
                row["total"] if row else None,
                f"{status}, failed {row['failed']}" if row else "waiting for the producer",
            )
            if deadline and time.monotonic() > deadline:
                bar.close()
                fail(
                    f"run {run_id} did not finish within {timeout:.0f}s (it goes on; see `evalctl status {run_id}`)"
                )
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


def _problem_text(p: dict[str, Any]) -> str:
    where = f"{p.get('unit', 'line')} {p['line']}: " if p.get("line") else ""
    field = f"{p['field']}: " if p.get("field") and not where else ""
    return f"{where}{field}{p.get('message', p)}"


# --------------------------------------------------------------------------- reading runs


async def _run_row(conn: asyncpg.Connection, run_id: str) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM runs WHERE run_id = $1", run_id)
    if row is None:
        fail(f"no run {run_id!r}")
    return row


async def cmd_status(args: argparse.Namespace, settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        run = await _run_row(conn, args.run)
        agg = await conn.fetchrow(
            "SELECT count(*) AS done, count(*) FILTER (WHERE error IS NOT NULL) AS failed,"
            " count(*) FILTER (WHERE attempts > 1) AS retried, count(*) FILTER (WHERE cache_hit) AS cache_hits,"
            " min(recorded_at) AS first, max(recorded_at) AS last FROM item_results WHERE run_id = $1",
            args.run,
        )
        dead = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", args.run)
    finally:
        await conn.close()
    start = run["published_at"] or run["created_at"]
    elapsed = ((agg["last"] if run["status"] == "completed" else None) or _now(start)) - start
    secs = max(elapsed.total_seconds(), 1e-9)
    status = {
        "run_id": args.run,
        "name": run["name"],
        "status": run["status"],
        "model": run["model"],
        "total": run["total"],
        "done": agg["done"],
        "failed": agg["failed"],
        "retried": agg["retried"],
        "cache_hits": agg["cache_hits"],
        "dead_letters": dead,
        "pending": (run["total"] - agg["done"]) if run["total"] is not None else None,
        "items_per_s": round(agg["done"] / secs, 3) if agg["done"] else 0.0,
        "elapsed_s": round(secs, 1),
        "problems": json.loads(run["problems"]) if run["problems"] else None,
    }
    if args.json:
        out_json(status)
        return
    for k, v in status.items():
        if v is not None:
            print(f"{k:>12}: {v}")


def _now(like: Any) -> Any:
    from datetime import datetime

    return datetime.now(like.tzinfo)


RESULT_FIELDS = (
    "item_id",
    "response",
    "extracted",
    "correct",
    "score",
    "error",
    "attempts",
    "cache_hit",
    "latency_ms",
    "served_by",
)


async def cmd_results(args: argparse.Namespace, settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await _run_row(conn, args.run)
        rows = await conn.fetch(
            f"SELECT {', '.join(RESULT_FIELDS)}, category FROM item_results WHERE run_id = $1 ORDER BY item_id",
            args.run,
        )
    finally:
        await conn.close()
    records = [dict(r) for r in rows]
    if args.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not args.output:
            fail("--format parquet needs -o FILE")
        pq.write_table(pa.Table.from_pylist(records), args.output)
        print(f"wrote {len(records)} results to {args.output}", file=sys.stderr)
        return
    stream = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115
    try:
        for r in records:
            stream.write(json.dumps(r, default=str) + "\n")
    finally:
        if args.output:
            stream.close()
            print(f"wrote {len(records)} results to {args.output}", file=sys.stderr)


async def cmd_report(args: argparse.Namespace, settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await _run_row(conn, args.run)
        summary = await summarise(conn, args.run)
        if args.exclude_flagged:
            try:
                summary["label_audit"] = await accuracy_without_flagged(
                    conn, settings, args.run, threshold=args.threshold
                )
            except (DatasetRefError, LookupError) as exc:
                fail(f"cannot audit the run's dataset: {exc}", EXIT_REJECTED)
        page = report_html.render(await report_html.collect(conn, args.run, summary)) if args.html else None
    finally:
        await conn.close()
    if args.html and page is not None:
        Path(args.html).write_text(page, encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        out_json(summary)
    elif not args.html:
        print_report(summary)


def print_report(s: dict[str, Any]) -> None:
    acc = f"{s['accuracy']:.1%}" if s["accuracy"] is not None else "n/a"
    lat = s["latency_ms"]
    print(f"run {s['run_id']} ({s['name']}): {s['status']}")
    print(f"  model {s['model']}   grader {s['grader']}")
    print(
        f"  items {s['total']}: {s['succeeded']} answered, {s['failed']} failed, {s['cache_hits']} from cache"
    )
    print(
        f"  accuracy {acc}"
        + (f" (answered only: {s['accuracy_answered']:.1%})" if s["accuracy_answered"] is not None else "")
    )
    if lat["p50"] is not None:
        print(
            f"  latency ms p50 {lat['p50']:.0f}  p95 {lat['p95']:.0f}  p99 {lat['p99']:.0f}   "
            f"throughput {s['items_per_s']} items/s"
        )
    for title, key in (("category", "by_category"), ("served by", "by_served_by")):
        if s[key]:
            print(f"  by {title}:")
            for name, b in s[key].items():
                print(
                    f"    {name:<32} {b['total']:>6} items  accuracy {b['accuracy']:.1%}  failed {b['failed']}"
                )
    if audit := s.get("label_audit"):
        clean = audit["accuracy_excluding_flagged"]
        print(
            f"  accuracy without the {audit['flagged']} item(s) whose gold the audit flags: "
            + (f"{clean:.1%}" if clean is not None else "n/a")
            + f" (raw {acc}; {len(audit['models'])} model(s) on this dataset version, threshold {audit['threshold']})"
        )
        for kind, why in audit["skipped"].items():
            print(f"    audit skipped {kind}: {why}")
    print(f"  dataset {s['dataset_sha256']}  manifest {s['manifest_sha256']}")


# --------------------------------------------------------------------------- dead letters


async def cmd_dlq(args: argparse.Namespace, settings: Settings) -> None:
    conn = await asyncpg.connect(settings.database_url)
    try:
        await _run_row(conn, args.run)
        if args.dlq_cmd == "list":
            rows = await conn.fetch(
                "SELECT id, item_id, original_topic, error, headers, created_at, redriven_at FROM dead_letters"
                " WHERE run_id = $1 ORDER BY id",
                args.run,
            )
            for r in rows:
                rec = {
                    "id": r["id"],
                    "item_id": r["item_id"],
                    "original_topic": r["original_topic"],
                    "error": r["error"],
                    "attempts": json.loads(r["headers"]).get("x-attempts"),
                    "created_at": r["created_at"],
                    "redriven_at": r["redriven_at"],
                }
                print(json.dumps(rec, default=str))
            print(f"{len(rows)} dead letter(s)", file=sys.stderr)
            return
        await redrive(conn, settings, args.run)
    finally:
        await conn.close()


def redriven(shard: Shard, items: list[Item]) -> Shard:
    """A dead-lettered shard's items as a new delivery: fresh attempts, due now, not yet
    routed and never parked (a kept parked_at would make the router find it parked past
    its timeout and dead-letter it again at once)."""
    return msgspec.structs.replace(
        shard, items=items, attempt=1, not_before=0.0, parked_at=0.0, routed_to=None, served_model=None
    )


async def redrive(conn: asyncpg.Connection, settings: Settings, run_id: str) -> int:
    """Puts the run's dead letters that carry items back on eval.shards with fresh attempts.
    Their recorded failures stay until a success replaces them."""
    rows = await conn.fetch(
        "SELECT id, payload FROM dead_letters WHERE run_id = $1 AND redriven_at IS NULL ORDER BY id", run_id
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    covered: list[int] = []
    items: set[tuple[str, str]] = set()
    try:
        for r in rows:
            try:
                shard = decode(bytes(r["payload"]), Shard)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # poison carries no item: nothing to redrive
            covered.append(r["id"])
            # A worker that died before committing dead-letters its items again: send
            # each item once however many letters it has.
            todo = [i for i in shard.items if (shard.shard_id, i.id) not in items]
            items.update((shard.shard_id, i.id) for i in todo)
            if todo:
                await producer.send_and_wait(
                    topics.SHARDS, encode(redriven(shard, todo)), key=run_id.encode()
                )
    finally:
        await producer.stop()
    await conn.execute("UPDATE dead_letters SET redriven_at = now() WHERE id = ANY($1::bigint[])", covered)
    print(f"redrove {len(items)} item(s) from {len(covered)} dead letter(s) of {run_id}", file=sys.stderr)
    return len(items)


# --------------------------------------------------------------------------- workers


async def read_heartbeats(bootstrap: str) -> list[Heartbeat]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    latest: dict[str, Heartbeat] = {}
    try:
        tps = await topic_partitions(consumer, topics.HEARTBEATS)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                for rec in records:
                    if rec.value:
                        try:
                            hb = decode(rec.value, Heartbeat)
                            latest[hb.worker_id] = hb
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            pass
                    elif rec.key:
                        latest.pop(rec.key.decode(), None)
    finally:
        await consumer.stop()
    return list(latest.values())


RECENT_S = 3600.0  # `evalctl workers` hides groups silent for longer (unless --all)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def worker_group_row(
    beats: list[Heartbeat], lag: dict[int, int], now: float, timeout_s: float, max_lag: int
) -> dict[str, Any]:
    """One group as `evalctl workers` shows it, judged by the router's rules (router/fleet.py,
    which the CLI's image does not carry): a member is live while its heartbeat is younger
    than ROUTER_HEARTBEAT_TIMEOUT_S and it is not stopped; the group is saturated at
    ROUTER_MAX_LAG outstanding shards per live member."""
    members = sorted((hb for hb in beats if hb.status != "stopped"), key=lambda hb: hb.worker_id)
    live = [hb for hb in members if now - hb.ts <= timeout_s and hb.status in ("ready", "starting")]
    total_lag = sum(lag.values())
    pressure = [
        hb.gpu_memory_used_bytes / (hb.gpu_memory_used_bytes + hb.gpu_memory_free_bytes)
        for hb in live
        if hb.gpu_memory_used_bytes is not None
        and hb.gpu_memory_free_bytes is not None
        and hb.gpu_memory_used_bytes + hb.gpu_memory_free_bytes > 0
    ]
    return {
        "group": beats[0].group,
        "model": max(beats, key=lambda hb: hb.ts).model,
        "health": "dead" if not live else "healthy" if len(live) == len(members) else "degraded",
        "healthy": len(live),
        "members": [
            {
                "worker_id": hb.worker_id,
                "status": hb.status if hb in live else "stale",
                "device": hb.device,
                "gpu_utilization": hb.gpu_utilization,
                "cpu_utilization": hb.cpu_utilization,
                "p95_ms": hb.latency_p95_ms,
                "queue_depth": hb.queue_depth,
                "age_s": round(now - hb.ts, 1),
            }
            for hb in members
        ],
        "lag": total_lag,
        "lag_by_partition": {str(p): n for p, n in sorted(lag.items())},
        "saturated": total_lag >= max_lag * len(live) if live else None,
        "gpu_utilization": _mean([hb.gpu_utilization for hb in live]),
        "cpu_utilization": _mean([hb.cpu_utilization for hb in live]),
        "gpu_memory_pressure": _mean(list(pressure)),
        "p95_ms": _mean([hb.latency_p95_ms for hb in live]),
        "last_heartbeat_s": round(now - max(hb.ts for hb in beats), 1),
    }


async def cmd_workers(args: argparse.Namespace, settings: Settings) -> None:
    now = time.time()
    by_group: dict[str, list[Heartbeat]] = {}
    for hb in await read_heartbeats(settings.kafka_bootstrap):
        by_group.setdefault(hb.group, []).append(hb)
    shown = {
        g: beats for g, beats in by_group.items() if args.all or now - max(b.ts for b in beats) < RECENT_S
    }
    lags = await asyncio.gather(
        *(
            group_lag(settings.kafka_bootstrap, topics.worker_consumer_group(g), topics.work_topic(g))
            for g in shown
        )
    )
    rows = [
        worker_group_row(beats, lag, now, settings.router_heartbeat_timeout_s, settings.router_max_lag)
        for beats, lag in zip(shown.values(), lags, strict=True)
    ]
    rows.sort(key=lambda r: (r["health"] == "dead", r["group"]))
    if args.json:
        out_json(rows)
        return

    def pct(v: float | None) -> str:
        return f"{100 * v:.0f}" if v is not None else "-"

    print(
        f"{'group':<24} {'model':<36} {'health':<8} {'live':>5} {'lag':>6} {'full':>4} "
        f"{'gpu%':>5} {'mem%':>5} {'p95 ms':>8}"
    )
    for r in rows:
        p95 = f"{r['p95_ms']:.0f}" if r["p95_ms"] is not None else "-"
        full = {True: "yes", False: "no", None: "-"}[r["saturated"]]
        print(
            f"{r['group']:<24} {r['model'][:36]:<36} {r['health']:<8} {r['healthy']:>2}/{len(r['members']):<2} "
            f"{r['lag']:>6} {full:>4} {pct(r['gpu_utilization']):>5} {pct(r['gpu_memory_pressure']):>5} {p95:>8}"
        )
        for m in r["members"]:
            util = m["gpu_utilization"] if m["gpu_utilization"] is not None else m["cpu_utilization"]
            print(
                f"    {m['worker_id']:<32} {m['status']:<8} {m['device'][:28]:<28} util {pct(util)}%  "
                f"p95 {m['p95_ms']:.0f} ms  queue {m['queue_depth']}  age {m['age_s']}s"
            )
    hidden = len(by_group) - len(shown)
    if hidden:
        print(f"({hidden} group(s) silent for over {RECENT_S / 3600:.0f} h not shown: --all)")


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="evalctl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

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

    st = sub.add_parser("status", help="progress, throughput, failures and retries of a run")
    st.add_argument("run")
    st.add_argument("--json", action="store_true")

    r = sub.add_parser("results", help="one record per item")
    r.add_argument("run")
    r.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    r.add_argument("-o", "--output", help="write to FILE instead of stdout")

    rep = sub.add_parser("report", help="the run summary")
    rep.add_argument("run")
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--html", metavar="FILE", help="also write an HTML report")
    rep.add_argument(
        "--exclude-flagged",
        action="store_true",
        help="also the accuracy without the items whose gold `evalctl audit` flags (every completed run "
        "on the run's dataset version votes), beside the raw figure",
    )
    rep.add_argument(
        "--threshold",
        type=probability,
        default=AUDIT_THRESHOLD,
        help=f"with --exclude-flagged: the audit's threshold (default {AUDIT_THRESHOLD})",
    )

    d = sub.add_parser("dlq", help="dead letters of a run")
    dsub = d.add_subparsers(dest="dlq_cmd", required=True)
    for name, text in (
        ("list", "list the run's dead letters"),
        ("redrive", "put the run's dead letters back"),
    ):
        p = dsub.add_parser(name, help=text)
        p.add_argument("run")

    w = sub.add_parser("workers", help="worker groups: members, model, lag, GPU utilisation, p95, health")
    w.add_argument("--json", action="store_true")
    w.add_argument("--all", action="store_true", help="also groups silent for over an hour")

    for name in extensions.MODULES:
        importlib.import_module(name).register(sub)
    return ap


COMMANDS = {
    "submit": cmd_submit,
    "status": cmd_status,
    "results": cmd_results,
    "report": cmd_report,
    "dlq": cmd_dlq,
    "workers": cmd_workers,
}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    try:
        handler = getattr(args, "handler", None) or COMMANDS[args.cmd]
        asyncio.run(handler(args, settings))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except (OSError, asyncpg.PostgresError, KafkaError, MinioException, urllib3.exceptions.HTTPError) as exc:
        fail(f"{type(exc).__name__}: {exc} (is the stack up? `make up`)")


if __name__ == "__main__":
    main()
