"""What every service shares: the broker factory, the HTTP routes (/healthz, /readyz,
/metrics) next to the FastStream app, dead-lettering, and the runner.

A service module stays short: `broker = make_broker(...)`, its subscribers, then
`app = make_app(broker, ...)`; `run(app)` serves it with uvicorn, which turns SIGTERM into
an orderly shutdown: stop consuming, let in-flight handlers finish (graceful_timeout),
commit, exit.
"""

from __future__ import annotations

import asyncio
import faulthandler
import functools
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, cast

import msgspec
import uvicorn
from aiokafka import ConsumerRecord
from faststream import BaseMiddleware
from faststream.asgi import AsgiFastStream, AsgiResponse, get, make_ping_asgi
from faststream.asgi.types import ASGIApp
from faststream.kafka import KafkaBroker
from faststream.kafka.prometheus import KafkaPrometheusMiddleware
from prometheus_client import REGISTRY, make_asgi_app

from evalstream.common import logs, metrics, spread, telemetry, topics
from evalstream.common.kafka_security import broker_security
from evalstream.common.messages import MAX_MESSAGE_BYTES, decode
from evalstream.common.messages import DeadLetterHeaders as H
from evalstream.common.metrics import DEAD_LETTERED
from evalstream.common.settings import ServiceSettings

if TYPE_CHECKING:  # the router's image has no database driver
    import asyncpg


@dataclass
class _Process:
    """This process's service: its name (the first broker made names it), the uvicorn server
    that runs it, and the exit status a fatal error asked for."""

    name: str | None = None
    server: uvicorn.Server | None = None
    exit_status: int | None = None


_process = _Process()


def make_broker(settings: ServiceSettings, service: str, *, graceful_timeout: float = 30.0) -> KafkaBroker:
    _process.name = _process.name or service
    return KafkaBroker(
        settings.kafka_bootstrap,
        security=broker_security(settings),
        client_id=f"evalstream-{service}",
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        # shards spread over every partition, round robin within a run (spread.py)
        partitioner=spread.partitioner,
        max_request_size=MAX_MESSAGE_BYTES,
        graceful_timeout=graceful_timeout,
        allow_auto_create_topics=False,
        # Outermost first: the trace span covers the handler, its logs and its metrics.
        middlewares=[
            telemetry.kafka_middleware(service, settings),
            RunIdMiddleware,
            KafkaPrometheusMiddleware(registry=REGISTRY, app_name=f"evalstream-{service}"),
        ],
        # Bodies stay bytes: every handler decodes its own (decode_or_dead_letter, with the
        # size and nesting checked first). FastStream's default would json.loads() them
        # before any handler ran, and a body nested 5,000 deep would fail every delivery
        # there, where no handler can make it a dead letter.
        decoder=_undecoded,
        logger=logging.getLogger("evalstream.kafka"),
        # one log line per message is noise at INFO (and real CPU at 10k items/s)
        log_level=logging.DEBUG,
    )


async def _undecoded(msg: Any) -> Any:
    """The message's body as it came (a batch's: the list of them), never parsed."""
    return msg.body


class RunIdMiddleware(BaseMiddleware):
    """Binds the run id of the message being handled (every key names its run:
    spread.run_of_key) for the handler's log lines; a batch binds it when all its records
    belong to one run."""

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        raw = msg.raw_message
        keys = {getattr(r, "key", None) for r in (raw if isinstance(raw, tuple) else (raw,))}
        runs = {spread.run_of_key(k) if isinstance(k, bytes) else None for k in keys}
        run_id = runs.pop() if len(runs) == 1 else None
        with logs.bind(run_id=run_id):
            return await call_next(msg)


ReadyCheck = Callable[[], Awaitable[bool]]
Record: TypeAlias = ConsumerRecord[bytes, bytes]


def record_of(msg: Any) -> Record:
    """The raw Kafka record behind a FastStream message (we decode bodies ourselves, so
    that an undecodable one becomes a dead letter instead of a handler error)."""
    return cast(Record, msg.raw_message)


def records_of(msg: Any) -> tuple[Record, ...]:
    """The raw records behind a FastStream batch message."""
    return cast(tuple[Record, ...], msg.raw_message)


def make_app(
    broker: KafkaBroker,
    *,
    lifespan: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    ready_checks: Sequence[ReadyCheck] = (),
    after_startup: Sequence[Callable[[], Awaitable[None]]] = (),
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    prefix_routes: Sequence[tuple[str, ASGIApp]] = (),
) -> AsgiFastStream:
    """/healthz: the process serves HTTP (liveness). /readyz: the app has started (its
    subscribers consume), the broker answers and every service-specific check passes (a
    worker's model is loaded, the database answers).

    Order: `lifespan` enters before the broker connects and exits after it stopped;
    `after_startup` runs once it is connected, `on_shutdown` before it disconnects.
    `prefix_routes` serve every path under a prefix (FastStream matches exact paths only)."""
    broker_ping = make_ping_asgi(broker, timeout=5.0, include_in_schema=False)
    started = asyncio.Event()  # every subscriber has joined its group and consumes

    async def mark_started() -> None:
        started.set()

    @get(include_in_schema=False)
    async def healthz(scope: Any) -> AsgiResponse:
        return AsgiResponse(b"ok\n", 200)

    @get(include_in_schema=False)
    async def readyz(scope: Any) -> AsgiResponse:
        if not started.is_set():
            return AsgiResponse(b"starting: subscribers not consuming yet\n", 503)
        if not await broker.ping(5.0):
            return AsgiResponse(b"broker unreachable\n", 503)
        for check in ready_checks:
            if not await check():
                return AsgiResponse(f"{getattr(check, '__name__', 'check')} failed\n".encode(), 503)
        return AsgiResponse(b"ready\n", 200)

    app = _App(
        broker,
        lifespan=lifespan,
        after_startup=[*after_startup, mark_started],
        on_shutdown=on_shutdown,
        asgi_routes=[
            ("/healthz", healthz),
            ("/readyz", readyz),
            ("/ping", broker_ping),
            ("/metrics", make_asgi_app(REGISTRY)),
        ],
    )
    app.prefix_routes = tuple(prefix_routes)
    return app


class _App(AsgiFastStream):
    prefix_routes: Sequence[tuple[str, ASGIApp]] = ()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for prefix, route in self.prefix_routes:
                if scope["path"].startswith(prefix):
                    await route(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


def run(app: AsgiFastStream, settings: ServiceSettings) -> None:
    logs.configure(settings.log_level, _process.name)
    metrics.start_series(_process.name)
    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=60,
        access_log=False,
        log_config=None,  # uvicorn's lines go through the root logger: JSON like the rest
        lifespan="on",
    )
    server = _process.server = uvicorn.Server(config)
    # `kill -USR2` prints every thread's stack to the log: a process that does not stop
    # says where it is
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # USR1: the bench sampler's
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(_serve_watched(server))
    if _process.exit_status is not None:
        raise SystemExit(_process.exit_status)


STALL_DUMP_S = 30.0  # an event loop that has not turned for this long prints every stack


async def _serve_watched(server: uvicorn.Server) -> None:
    """uvicorn's `Server.run`, with a watchdog: faulthandler's timer fires from its own
    thread unless the loop re-arms it, so a loop stuck in a blocking call or a spin leaves
    the stacks in the log instead of a silent process (signals included: uvicorn's SIGTERM
    handler only sets a flag that the loop reads)."""

    async def rearm() -> None:
        while True:
            faulthandler.dump_traceback_later(STALL_DUMP_S, file=sys.stderr)
            await asyncio.sleep(min(1.0, STALL_DUMP_S / 4))

    watchdog = asyncio.create_task(rearm(), name="stall-watchdog")
    try:
        await server.serve()
    finally:
        watchdog.cancel()
        faulthandler.cancel_dump_traceback_later()


def shut_down_with_error(message: str, exit_status: int = 3) -> None:
    """A fatal error after startup (a model that cannot load): the same graceful shutdown
    as on SIGTERM, then the process exits with `exit_status`."""
    logging.getLogger("evalstream").critical("%s; shutting down", message)
    _process.exit_status = exit_status
    server = _process.server
    if server is not None:
        server.should_exit = True


H_ = TypeVar("H_", bound=Callable[..., Awaitable[None]])


class MessageAtFault(Exception):
    """A handler's failure that its PoisonGuard counted against the message (its
    dependencies answer): redelivered at once, no backoff."""


def backoff_on_error(delay_s: float = 1.0) -> Callable[[H_], H_]:
    """A handler that fails (the database or the S3 store is down) is redelivered at once
    (NACK_ON_ERROR); pausing first keeps the redelivery from spinning against the outage."""

    def decorate(handler: H_) -> H_:
        @functools.wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> None:
            try:
                await handler(*args, **kwargs)
            except MessageAtFault:
                # the message's own failure, counted (poison.py): nothing to wait out
                logging.getLogger(handler.__module__).exception(
                    "%s failed; the message(s) will be redelivered", handler.__name__
                )
                raise
            except Exception:
                logging.getLogger(handler.__module__).exception(
                    "%s failed; the message(s) will be redelivered", handler.__name__
                )
                await asyncio.sleep(delay_s)
                raise

        return cast(H_, wrapper)

    return decorate


def dead_letter_headers(
    record: ConsumerRecord[Any, Any] | None,
    error: BaseException | str,
    *,
    attempts: int = 1,
    run_id: str | None = None,
    item_id: str | None = None,
    original_topic: str | None = None,
) -> dict[str, str]:
    """Headers of a dead letter: where the message came from and why it died."""
    headers = {
        H.ERROR: str(error)[:2000] or type(error).__name__,
        H.ERROR_TYPE: type(error).__name__ if isinstance(error, BaseException) else "ItemFailed",
        H.ATTEMPTS: str(attempts),
        H.FAILED_AT: f"{time.time():.3f}",
    }
    if record is not None:
        headers[H.ORIGINAL_TOPIC] = record.topic
        headers[H.ORIGINAL_PARTITION] = str(record.partition)
        headers[H.ORIGINAL_OFFSET] = str(record.offset)
    if original_topic:
        headers[H.ORIGINAL_TOPIC] = original_topic
    if run_id:
        headers[H.RUN_ID] = run_id
    if item_id:
        headers[H.ITEM_ID] = item_id
    return headers


async def dead_letter(
    broker: KafkaBroker,
    payload: bytes,
    headers: dict[str, str],
    *,
    key: bytes | None = None,
    reason: str = "poison",
) -> None:
    await broker.publish(payload, topics.DLQ, key=key, headers=headers)
    DEAD_LETTERED.labels(topic=headers.get(H.ORIGINAL_TOPIC, "?"), reason=reason).inc()


S = TypeVar("S")


class Started(Generic[S]):
    """What an app's lifespan makes for its handlers (pool, store, clients), typed: set on
    startup, read by handlers, which never run before it is set."""

    def __init__(self) -> None:
        self._value: S | None = None

    def set(self, value: S) -> None:
        self._value = value

    def is_set(self) -> bool:
        return self._value is not None

    def get(self) -> S:
        if self._value is None:
            raise RuntimeError("used before the app's lifespan started it")
        return self._value


M = TypeVar("M")


async def decode_or_dead_letter(
    broker: KafkaBroker, record: Record, kind: type[M], decoder: Callable[[bytes], M] | None = None
) -> M | None:
    """The record's body as a `kind` (read by `decoder`, default: msgspec's), or None once it
    is on eval.dlq: an undecodable message (poison) is recorded and skipped, never allowed to
    stop its partition. Exceptions of `decoder` that are not about the bytes (JobRejected:
    a valid object that is no valid job) propagate."""
    raw = record.value or b""
    try:
        return decoder(raw) if decoder is not None else decode(raw, kind)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, RecursionError) as exc:
        # anything the bytes make decoding raise is the message's problem (msgspec checks the
        # size and nesting first: messages.decode); a JobRejected is the decoder's answer
        logging.getLogger("evalstream").warning(
            "undecodable %s at %s[%d]@%d dead-lettered: %s",
            getattr(kind, "__name__", kind),  # a union of messages has no name
            record.topic,
            record.partition,
            record.offset,
            exc,
        )
        await dead_letter(broker, raw, dead_letter_headers(record, exc), key=record.key)
        return None


def database_ready(pool: Callable[[], asyncpg.Pool]) -> ReadyCheck:
    """A /readyz check: the database answers through the pool `pool()` returns (which
    raises while the lifespan has not made it yet)."""

    async def database_ready() -> bool:
        try:
            return bool(await pool().fetchval("SELECT 1"))
        except Exception:
            return False

    return database_ready
