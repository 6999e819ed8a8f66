"""The worker service: eval.work.<group> -> engine -> eval.results (+ eval.retry, eval.dlq).

The lifecycle lives here (consume, start, stop). The model work lives in runner.py, what a
round leaves on the broker in publishing.py, heartbeats in heartbeats.py, the engines in
engine_registry.py and the main model's load in state.py. Shards arrive in small batches
(up to WORKER_MAX_SHARDS, waiting at most BATCH_MAX_WAIT_MS), so that items of several
shards share engine batches. Offsets are committed only after every result, retry and dead
letter of the batch is on the broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from faststream import AckPolicy
from faststream.kafka.annotations import KafkaMessage
from opentelemetry.trace import Span

from evalstream.common import db, logs, service, telemetry, topics
from evalstream.common.messages import Shard
from evalstream.common.metrics import SHARDS, STAGE_LATENCY
from evalstream.common.settings import WorkerSettings
from evalstream.common.testhooks import CrashPoints
from evalstream.common.topics_admin import ensure_topics
from evalstream.worker.cache import AnswerCache
from evalstream.worker.engine_registry import shared_engines
from evalstream.worker.heartbeats import Heartbeats
from evalstream.worker.publishing import OutcomePublisher
from evalstream.worker.redelivery import Redeliveries
from evalstream.worker.runner import ModelRunner, start_runner
from evalstream.worker.state import ModelLoad, WorkerState

settings = WorkerSettings.from_env()
worker_id = settings.resolved_worker_id
broker = service.make_broker(settings, f"worker-{settings.worker_group}", graceful_timeout=120.0)
engines = shared_engines(settings)  # the main model may be loading already (__main__)
state = WorkerState(model=ModelLoad(engines, settings.worker_model))
heartbeats = Heartbeats(broker, settings, worker_id, state, engines)
publisher = OutcomePublisher(broker, worker_id=worker_id, group=settings.worker_group)
redeliveries = Redeliveries(broker, settings.worker_max_deliveries)
test_hooks = CrashPoints(settings.fault_inject)  # test-only: worker_fail_item
CONSUMER_GROUP = topics.worker_consumer_group(settings.worker_group)
ROUND_FETCH_BYTES = 256 * 1024  # ≈ WORKER_MAX_SHARDS shards of a few dozen short questions


@broker.subscriber(
    topics.work_topic(settings.worker_group),
    group_id=CONSUMER_GROUP,
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
    await state.model.wait()  # the first shards may arrive while the model still loads
    now = time.time()
    for record in records:  # broker timestamp of the router's publish -> picked up here
        STAGE_LATENCY.labels(stage="queue_wait").observe(max(0.0, now - record.timestamp / 1000))
    keep = await redeliveries.admit(records)  # poison shards: dead-lettered, not handled
    records = tuple(record for record, _ in keep)
    with telemetry.consume_spans(records, CONSUMER_GROUP) as spans:
        if any(n > 1 for _, n in keep):
            await redeliveries.one_by_one(keep, spans, handle_shards)  # find which shard fails
        elif records:
            await handle_shards(records, spans)


async def handle_shards(records: tuple[service.Record, ...], spans: list[Span]) -> None:
    shards: list[Shard] = []
    span_of: dict[str, Span] = {}
    for record, span in zip(records, spans, strict=True):
        shard = await service.decode_or_dead_letter(broker, record, Shard)
        if shard is None:
            SHARDS.labels(service="worker", outcome="undecodable").inc()
            continue
        test_hooks.fail_on_items((i.id for i in shard.items), f"shard {shard.shard_id}")
        shards.append(shard)
        span_of[shard.shard_id] = span
        span.set_attribute("evalstream.shard_id", shard.shard_id)
    if not shards:
        return
    assert state.runner is not None, "shards before the lifespan made the runner"
    state.in_flight = len(shards)
    started = time.monotonic()
    try:
        with logs.bind(shard_id=",".join(s.shard_id for s in shards[:8])):
            outcome = await state.runner.run(shards)
            await publisher.publish(shards, outcome, span_of)
    finally:
        state.in_flight = 0
    STAGE_LATENCY.labels(stage="worker_batch").observe(time.monotonic() - started)


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    # The weights load in a thread (started by __main__ before the service's imports, else
    # here) while the rest of startup happens beside it: the work topic (a worker of a new
    # group creates its own, else it would wait for one nobody makes; idempotent), the broker
    # connection, the database pool, "starting" heartbeats (routers already queue shards for
    # this group), and, once this returns, the group join and the first fetch; the grading
    # processes once the model is in. Shards wait for the model in on_shards; a model that
    # cannot load shuts the worker down with an error (state.ModelLoad).
    state.model.start()
    pool = None
    try:
        await ensure_topics(settings, [settings.worker_group], base=False)
        await broker.connect()
        heartbeats.start()
        pool = await db.create_pool(settings.database_url)
    except BaseException:
        state.model.cancel()
        await heartbeats.stop_loop()
        if pool is not None:
            await pool.close()
        raise
    state.runner = await start_runner(settings, engines, AnswerCache(pool), start_grading=False)
    grading = asyncio.create_task(start_grading(state.runner))
    try:
        yield
    finally:
        grading.cancel()
        await pool.close()
        engines.close()
        await state.runner.close_grading()


async def start_grading(runner: ModelRunner) -> None:
    """The grading pool's processes start once the main model has loaded: until then they
    would take cores its load needs (OpenVINO's compile, torch's read), and no shard runs
    before it anyway. A batch graded first starts them itself."""
    try:
        await state.model.wait()
    except Exception:  # a model that cannot load shuts the worker down (state.ModelLoad)
        return
    await runner.start_grading()


app = service.make_app(
    broker,
    lifespan=lifespan,
    ready_checks=[state.model.loaded],
    after_startup=[state.mark_consuming],
    on_shutdown=[heartbeats.say_stopped],
)
