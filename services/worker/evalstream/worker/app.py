"""The worker service: eval.work.<group> -> engine -> eval.results (+ eval.retry, eval.dlq).

The lifecycle lives here (consume, publish, heartbeat); the model work lives in
runner.ModelRunner. Shards arrive in small batches (up to WORKER_MAX_SHARDS, waiting at
most BATCH_MAX_WAIT_MS), so that items of several shards share engine batches. Offsets
are committed only after every result, retry and dead letter of the batch is on the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage
from opentelemetry.trace import Span

from evalstream.common import db, logs, service, telemetry, topics
from evalstream.common.deliveries import DeliveryCounter
from evalstream.common.messages import DeadLetterHeaders as H
from evalstream.common.messages import Heartbeat, Shard, ShardResult, WorkerStatus, decode, encode
from evalstream.common.metrics import (
    CPU_UTILIZATION,
    GPU_MEMORY_FREE,
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_TEMPERATURE,
    GPU_UTILIZATION,
    HOST_MEMORY_AVAILABLE,
    ITEMS,
    SHARDS,
    STAGE_LATENCY,
    WORKER_HEARTBEAT,
)
from evalstream.common.service import MESSAGE_BUDGET_BYTES
from evalstream.common.settings import Settings
from evalstream.common.specs import serves
from evalstream.common.topics_admin import ensure_topics
from evalstream.worker.cache import AnswerCache
from evalstream.worker.engines import load_engine
from evalstream.worker.engines.base import Engine, PermanentEngineError
from evalstream.worker.engines.chaos import ChaosEngine
from evalstream.worker.engines.slow import SlowEngine
from evalstream.worker.gpu import sample_device_metrics
from evalstream.worker.grading_pool import GradingPool
from evalstream.worker.runner import Failure, ModelRunner, Outcome, RunnerConfig

log = logging.getLogger("evalstream.worker")
settings = Settings.from_env()
worker_id = settings.resolved_worker_id
broker = service.make_broker(settings, f"worker-{settings.worker_group}", graceful_timeout=120.0)


class Engines:
    """The engines of the SPECs this group serves, loaded on first use and kept."""

    def __init__(self) -> None:
        self._loaded: dict[str, Engine] = {}

    def __call__(self, spec: str) -> Engine:
        engine = self._loaded.get(spec)
        if engine is None:
            if not serves(settings.worker_model, spec):
                raise PermanentEngineError(f"group {settings.worker_group} does not serve model {spec!r}")
            engine = load_engine(spec, settings)
            if settings.engine_faults:
                engine = ChaosEngine(engine, settings.engine_faults)
            if settings.engine_delay_ms:
                engine = SlowEngine(engine, settings.engine_delay_ms)
            self._loaded[spec] = engine
        return engine

    def close(self) -> None:
        for e in self._loaded.values():
            e.close()

    @property
    def device(self) -> str:
        return next((e.device for e in self._loaded.values() if e.device != "cpu"), "cpu")


engines = Engines()
# FAULT_INJECT="worker_fail_item=<item id>": the handler fails on every shard holding that item
FAILING_ITEMS = frozenset(
    v for k, _, v in (p.partition("=") for p in settings.fault_inject.split(",")) if k == "worker_fail_item"
)
ROUND_FETCH_BYTES = 256 * 1024  # ≈ WORKER_MAX_SHARDS shards of a few dozen short questions
state: dict[str, Any] = {"ready": False, "consuming": False, "draining": False, "in_flight": 0}


@broker.subscriber(
    topics.work_topic(settings.worker_group),
    group_id=topics.worker_consumer_group(settings.worker_group),
    batch=True,
    max_records=settings.worker_max_shards,
    batch_timeout_ms=settings.batch_max_wait_ms,
    auto_offset_reset="earliest",
    ack_policy=AckPolicy.NACK_ON_ERROR,
    # A batch on a slow device can take minutes: don't let the group evict us for it (the
    # model work runs in a thread, so heartbeats keep flowing). A stopped or dead process
    # is still noticed within the session timeout.
    max_poll_interval_ms=settings.worker_max_poll_interval_ms,
    session_timeout_ms=15_000,
    heartbeat_interval_ms=3_000,
    max_partition_fetch_bytes=8 * 1024 * 1024,
    # Dynamic batching's max wait, done by the broker: a fetch returns once a round's worth
    # of shards is there or BATCH_MAX_WAIT_MS has passed, so that the shards of a run that
    # arrive a few ms apart share one engine round instead of each starting its own. While
    # a round runs, the next fetch is already waiting, so a deep queue never pays it.
    fetch_min_bytes=ROUND_FETCH_BYTES,
    fetch_max_wait_ms=settings.batch_max_wait_ms,
)
@service.backoff_on_error()
async def on_shards(msg: KafkaMessage) -> None:
    records = service.records_of(msg)
    await model_ready()  # the first shards may arrive while the model still loads
    now = time.time()
    for record in records:  # broker timestamp of the router's publish -> picked up here
        STAGE_LATENCY.labels(stage="queue_wait").observe(max(0.0, now - record.timestamp / 1000))
    # --- poison shards (issue 12): dead-lettered after WORKER_MAX_DELIVERIES deliveries
    keep, worn = deliveries.split(records)
    for record, n in worn:
        await dead_letter_worn(record, deliveries.why(record, n), n)
    records = tuple(record for record, _ in keep)
    with telemetry.consume_spans(records, topics.worker_consumer_group(settings.worker_group)) as spans:
        if any(n > 1 for _, n in keep):
            await handle_one_by_one(keep, spans)  # redelivered: find which shard fails
        elif records:
            await handle_shards(records, spans)


async def handle_one_by_one(records: list[tuple[service.Record, int]], spans: list[Span]) -> None:
    """Each shard of a redelivered batch on its own: the others are not held back by one that
    fails, and one that fails its last allowed delivery is dead-lettered now."""
    failed: Exception | None = None
    for (record, n), span in zip(records, spans, strict=True):
        try:
            await handle_shards((record,), [span])
        except Exception as exc:
            deliveries.failed(record, exc)
            if n >= deliveries.limit:
                await dead_letter_worn(record, deliveries.why(record, n), n)
            else:
                failed = exc
    if failed is not None:
        raise failed


async def dead_letter_worn(record: service.Record, error: str, n: int) -> None:
    log.error(
        "work message %s[%d]@%d dead-lettered: %s", record.topic, record.partition, record.offset, error
    )
    headers = service.dead_letter_headers(record, error, attempts=n)
    headers[H.ERROR_TYPE] = "DeliveriesExceeded"
    await service.dead_letter(broker, record.value or b"", headers, key=record.key, reason="deliveries")
    SHARDS.labels(service="worker", outcome="dead_lettered").inc()


deliveries = DeliveryCounter(settings.worker_max_deliveries)
# --- end poison shards


async def handle_shards(records: tuple[service.Record, ...], spans: list[Span]) -> None:
    shards: list[Shard] = []
    span_of: dict[str, Span] = {}
    for record, span in zip(records, spans, strict=True):
        try:
            shards.append(decode(record.value or b"", Shard))
            if FAILING_ITEMS and any(i.id in FAILING_ITEMS for i in shards[-1].items):  # fault injection
                raise RuntimeError(f"injected fault: shard {shards[-1].shard_id} holds a failing item")
            span_of[shards[-1].shard_id] = span
            span.set_attribute("evalstream.shard_id", shards[-1].shard_id)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await service.dead_letter(
                broker, record.value or b"", service.dead_letter_headers(record, exc), key=record.key
            )
            SHARDS.labels(service="worker", outcome="undecodable").inc()
    if not shards:
        return
    state["in_flight"] = len(shards)
    started = time.monotonic()
    try:
        with logs.bind(shard_id=",".join(s.shard_id for s in shards[:8])):
            outcome = await state["runner"].run(shards)
            await publish_outcome(shards, outcome, span_of)
    finally:
        state["in_flight"] = 0
    STAGE_LATENCY.labels(stage="worker_batch").observe(time.monotonic() - started)


def result_messages(payload: ShardResult) -> list[bytes]:
    """The shard's results as one message, or several when they would not fit in one."""
    data = encode(payload)
    if len(data) <= MESSAGE_BUDGET_BYTES:
        return [data]
    if len(payload.results) == 1:  # one huge answer: keep its head, say so
        r = payload.results[0]
        cut = msgspec.structs.replace(
            r,
            response=(r.response or "")[: MESSAGE_BUDGET_BYTES // 8] + "\n[truncated to fit a message]",
            extracted=(r.extracted or "")[:1000] or None,
            prompt=(r.prompt or "")[:1000] or None,
            evidence=(r.evidence or "")[:1000] or None,
        )
        return [encode(msgspec.structs.replace(payload, results=[cut]))]
    half = len(payload.results) // 2
    return [
        *result_messages(msgspec.structs.replace(payload, results=payload.results[:half])),
        *result_messages(msgspec.structs.replace(payload, results=payload.results[half:])),
    ]


async def publish_outcome(
    shards: list[Shard], outcome: Outcome, spans: Mapping[str, Span] | None = None
) -> None:
    """Results, retries and dead letters, all acknowledged by the broker before we return
    (and so before the offsets are committed). Each is published inside its shard's span, so
    that it carries the shard's trace on."""
    span = (spans or {}).get
    sends = []
    for shard in shards:
        results = outcome.results.get(shard.shard_id, [])
        if results or not any(f.shard.shard_id == shard.shard_id for f in outcome.failures):
            payload = ShardResult(
                run_id=shard.run_id,
                shard_id=shard.shard_id,
                worker_id=worker_id,
                group=settings.worker_group,
                results=results,
            )
            sends += [
                telemetry.in_span(
                    span(shard.shard_id), broker.publish(data, topics.RESULTS, key=shard.run_id.encode())
                )
                for data in result_messages(payload)
            ]
        ITEMS.labels(service="worker", status="succeeded").inc(len(results))
        ITEMS.labels(service="worker", status="cache_hit").inc(sum(r.cache_hit for r in results))
        SHARDS.labels(service="worker", outcome="done").inc()
    retry: dict[str, list[Failure]] = {}
    for f in outcome.failures:
        if f.transient and f.shard.attempt < f.shard.retry.max_attempts:
            retry.setdefault(f.shard.shard_id, []).append(f)
        else:
            sends.append(telemetry.in_span(span(f.shard.shard_id), dead_letter_item(f)))
    for failures in retry.values():
        shard = failures[0].shard
        again = msgspec.structs.replace(
            shard,
            items=[f.item for f in failures],
            attempt=shard.attempt + 1,
            not_before=time.time() + shard.retry.delay_after(shard.attempt),
        )
        sends.append(
            telemetry.in_span(
                span(shard.shard_id), broker.publish(encode(again), topics.RETRY, key=shard.run_id.encode())
            )
        )
        ITEMS.labels(service="worker", status="retried").inc(len(failures))
    await asyncio.gather(*sends)


async def dead_letter_item(f: Failure) -> None:
    one = msgspec.structs.replace(f.shard, items=[f.item])
    headers = service.dead_letter_headers(
        None,
        f.error,
        attempts=f.shard.attempt,
        run_id=f.shard.run_id,
        item_id=f.item.id,
        original_topic=topics.work_topic(settings.worker_group),
    )
    await service.dead_letter(broker, encode(one), headers, key=f.shard.run_id.encode(), reason="failed")
    ITEMS.labels(service="worker", status="dead_lettered").inc()


async def heartbeat(status: WorkerStatus) -> None:
    runner: ModelRunner | None = state.get("runner")
    m = await asyncio.to_thread(sample_device_metrics)
    p50, p95, tps, err = runner.take_stats() if runner else (0.0, 0.0, 0.0, 0.0)
    hb = Heartbeat(
        worker_id=worker_id,
        group=settings.worker_group,
        model=settings.worker_model,
        ts=time.time(),
        device=engines.device if engines.device != "cpu" else m.device,
        queue_depth=state["in_flight"],
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        tokens_per_s=tps,
        error_rate=err,
        status=status,
        **m.heartbeat_fields(),
    )
    if m.gpu_utilization is not None:
        GPU_UTILIZATION.labels(device=m.device).set(m.gpu_utilization)
        GPU_MEMORY_USED.labels(device=m.device).set(m.gpu_memory_used_bytes or 0)
        GPU_MEMORY_FREE.labels(device=m.device).set(m.gpu_memory_free_bytes or 0)
        if m.gpu_temperature_c is not None:
            GPU_TEMPERATURE.labels(device=m.device).set(m.gpu_temperature_c)
        if m.gpu_power_w is not None:
            GPU_POWER.labels(device=m.device).set(m.gpu_power_w)
    if m.cpu_utilization is not None:
        CPU_UTILIZATION.set(m.cpu_utilization)
    if m.memory_free_bytes is not None:
        HOST_MEMORY_AVAILABLE.set(m.memory_free_bytes)
    await broker.publish(encode(hb), topics.HEARTBEATS, key=worker_id.encode())
    # Only once it is on the broker: the "group without heartbeats" alert reads this.
    WORKER_HEARTBEAT.labels(worker_group=settings.worker_group, worker_id=worker_id).set(hb.ts)


async def heartbeat_loop() -> None:
    while True:
        try:
            await heartbeat(status())
        except Exception:
            log.exception("heartbeat failed")
        await asyncio.sleep(settings.heartbeat_interval_s)


def main_model() -> str | None:
    """The group's main model: the first SPEC of WORKER_MODEL that is not a pattern."""
    return next((s.strip() for s in settings.worker_model.split(",") if "*" not in s and s.strip()), None)


async def load_main_model() -> None:
    if spec := main_model():
        t0 = time.monotonic()
        await asyncio.to_thread(engines, spec)
        log.info("engine %s loaded in %.1fs on %s", spec, time.monotonic() - t0, engines.device)


def on_model_loaded(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    if exc := task.exception():
        service.shut_down_with_error(f"model {main_model()!r} cannot be loaded: {exc!r}")
    else:
        state["ready"] = True


async def model_ready() -> None:
    """Returns once the main model is loaded (raises if it cannot be)."""
    await asyncio.shield(state["loading"])


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    # The weights load in a thread while the rest of startup happens beside it: the work
    # topic (a worker of a new group creates its own, else it would wait for one nobody
    # makes; idempotent), the broker connection, the database pool, "starting" heartbeats
    # (routers already queue shards for this group), and, once this returns, the group join
    # and the first fetch. Shards wait for the model in on_shards; a model that cannot load
    # shuts the worker down with an error (on_model_loaded).
    loading = state["loading"] = asyncio.create_task(load_main_model())
    loading.add_done_callback(on_model_loaded)
    pool = None
    try:
        await ensure_topics(settings.kafka_bootstrap, [settings.worker_group])
        await broker.connect()
        state["beat"] = asyncio.create_task(heartbeat_loop())
        pool = await db.create_pool(settings.database_url)
    except BaseException:
        loading.cancel()
        await stop_heartbeat_loop()
        if pool is not None:
            await pool.close()
        raise
    grading = GradingPool(  # string graders: off this process, each item under a deadline
        settings.grading_processes, settings.grading_timeout_s, settings.grading_memory_mb * 1024 * 1024
    )
    await asyncio.to_thread(grading.start)
    state["runner"] = ModelRunner(
        RunnerConfig(
            group=settings.worker_group,
            token_budget=settings.batch_token_budget,
            max_items=settings.batch_max_items,
        ),
        engines,
        AnswerCache(pool),
        grading,
    )
    try:
        yield
    finally:
        await pool.close()
        engines.close()
        await asyncio.to_thread(grading.close)


def status() -> WorkerStatus:
    """What heartbeats say: routers send shards to starting and ready workers alike."""
    if state["draining"]:
        return "draining"
    return "ready" if state["ready"] and state["consuming"] else "starting"


async def mark_consuming() -> None:
    state["consuming"] = True


async def stop_heartbeat_loop() -> None:
    beat: asyncio.Task[None] | None = state.pop("beat", None)
    if beat:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat


async def stop_heartbeats() -> None:
    """Before the broker disconnects: tell the router we are gone, so it stops routing here."""
    state["draining"] = True
    await stop_heartbeat_loop()
    with contextlib.suppress(Exception):
        await heartbeat("stopped")


async def model_loaded() -> bool:
    return bool(state["ready"])


app = service.make_app(
    broker,
    lifespan=lifespan,
    ready_checks=[model_loaded],
    after_startup=[mark_consuming],
    on_shutdown=[stop_heartbeats],
)
