"""Tracing with OpenTelemetry: W3C trace context in Kafka headers from `evalctl submit` to
the aggregator, spans after the messaging and GenAI semantic conventions.

* Export is off by default; OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) turns on
  OTLP/HTTP export (the SDK reads the other OTEL_* variables itself); OTEL_SDK_DISABLED=true
  turns tracing off entirely. Without export, spans are still made (a few microseconds per
  message, never per item) so that trace ids propagate and appear in the logs.
* Single-message consumers (producer, router) get their spans from FastStream's
  KafkaTelemetryMiddleware, which extracts the context from the headers and injects it on
  every publish made inside the handler.
* Batch consumers (worker, aggregator): FastStream starts a new trace per batch (with links),
  so `consume_spans` adds one span per record that continues the record's own trace; the
  worker publishes each shard's results inside that shard's span (`in_span`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

from aiokafka import ConsumerRecord
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from evalstream.common import logs, spread, topics
from evalstream.common.settings import TelemetrySettings

T = TypeVar("T")
H = TypeVar("H", bound=Callable[..., Awaitable[Any]])
TRACER_NAME = "evalstream"
_W3C = TraceContextTextMapPropagator()
_provider: TracerProvider | None = None


class _QuietSampler(Sampler):
    """Everything, except traces that start with a heartbeat (one every 2 s per worker would
    drown the traces people look for)."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if name.startswith(topics.HEARTBEATS):
            return SamplingResult(Decision.DROP)
        return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return "QuietSampler"


def setup(service: str, settings: TelemetrySettings | None = None) -> TracerProvider | None:
    """The process's tracer provider (made once; `service` names it in the traces)."""
    global _provider
    settings = settings or TelemetrySettings.from_env()
    if settings.otel_sdk_disabled:
        return None
    if _provider is None:
        resource = Resource.create(
            {"service.name": f"evalstream-{service}", "service.namespace": "evalstream"}
        )
        exporting = bool(settings.otel_exporter_otlp_traces_endpoint or settings.otel_exporter_otlp_endpoint)
        # Without a collector, spans are not recorded: they still carry trace ids (to the log
        # lines and the messages' headers), at a fraction of the cost of spans nobody reads.
        sampler = ParentBased(root=_QuietSampler()) if exporting else ALWAYS_OFF
        provider = TracerProvider(resource=resource, sampler=sampler)
        if exporting:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # The exporter takes the endpoint, headers, timeout from the OTEL_* variables.
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=500))
        trace.set_tracer_provider(provider)
        _provider = provider
    return _provider


def shutdown() -> None:
    """Flushes what is still queued for export (the SDK also does it at exit)."""
    if _provider is not None:
        _provider.force_flush(5_000)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME, tracer_provider=_provider)


def kafka_middleware(service: str, settings: TelemetrySettings) -> Any:
    """FastStream's tracing middleware (imported here: evalctl, which traces its own sends,
    never loads FastStream)."""
    from faststream.kafka.opentelemetry import KafkaTelemetryMiddleware

    return KafkaTelemetryMiddleware(tracer_provider=setup(service, settings), include_messages_counters=False)


# --------------------------------------------------------------------------- headers


def inject(ctx: Context | None = None) -> list[tuple[str, bytes]]:
    """traceparent (and tracestate) of the current span, as aiokafka headers."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=ctx)
    return [(k, v.encode()) for k, v in carrier.items()]


def extract(headers: Sequence[tuple[str, bytes]] | None) -> Context:
    carrier = {k: v.decode("latin-1") for k, v in headers or () if v is not None}
    return _W3C.extract(carrier)


def _key(record: ConsumerRecord[Any, Any]) -> str | None:
    """The run the record's key names (spread.run_of_key)."""
    key = record.key
    if isinstance(key, bytes):
        return spread.run_of_key(key)
    return str(key) if key is not None else None


# --------------------------------------------------------------------------- spans


@contextmanager
def send_span(destination: str, run_id: str) -> Iterator[list[tuple[str, bytes]]]:
    """A PRODUCER span for a message published with aiokafka directly (evalctl submit, which
    starts a run's trace); yields the headers that carry it on."""
    attributes = {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": destination,
        "messaging.kafka.message.key": run_id,
        "evalstream.run_id": run_id,
    }
    with tracer().start_as_current_span(f"send {destination}", kind=SpanKind.PRODUCER, attributes=attributes):
        yield inject()


@contextmanager
def consume_spans(
    records: Sequence[ConsumerRecord[Any, Any]], group: str, operation: str = "process"
) -> Iterator[list[Span]]:
    """One CONSUMER span per record, each continuing the trace its headers carry; the
    first is made current (work done for the batch nests under it, the others link to it).
    Every record is keyed by its run id, which the spans and log lines carry too."""
    t = tracer()
    spans: list[Span] = []
    for record in records:
        run_id = _key(record)
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": operation,
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.consumer.group.name": group,
            "messaging.kafka.offset": record.offset,
        }
        if run_id:
            attributes["messaging.kafka.message.key"] = run_id
            attributes["evalstream.run_id"] = run_id
        spans.append(
            t.start_span(
                f"{operation} {record.topic}",
                context=extract(record.headers),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                links=[Link(spans[0].get_span_context())] if spans else None,
            )
        )
    run_ids = {_key(r) for r in records}
    with ExitStack() as stack:
        if spans:
            token = otel_context.attach(trace.set_span_in_context(spans[0]))
            stack.callback(otel_context.detach, token)
        stack.enter_context(logs.bind(run_id=run_ids.pop() if len(run_ids) == 1 else None))
        try:
            yield spans
        except BaseException as exc:
            for span in spans:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            for span in spans:
                span.end()


def traced_batch(group: str) -> Callable[[H], H]:
    """A batch handler whose records each get their span (consume_spans) around its work."""

    def decorate(handler: H) -> H:
        @functools.wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            msg = next(v for v in (*args, *kwargs.values()) if hasattr(v, "raw_message"))
            with consume_spans(msg.raw_message, group):
                return await handler(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


async def in_span(span: Span | None, aw: Awaitable[T]) -> T:
    """Awaits `aw` with `span` current, so that a publish inside carries its context."""
    if span is None:
        return await aw
    with trace.use_span(span, end_on_exit=False):
        return await aw


_PROVIDERS = {
    "hf": "huggingface",
    "openai": "openai",
    "replay": "evalstream.replay",
    "null": "evalstream.null",
}


@contextmanager
def engine_span(model: str, generation: Any, batch_size: int) -> Iterator[Span]:
    """A GenAI inference span around one engine call (`gen_ai.*` attributes; the caller adds
    the token usage once the batch is done)."""
    kind, _, name = model.partition(":")
    remote = kind == "openai"
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": _PROVIDERS.get(kind, kind),
        "gen_ai.request.model": name or model,
        "gen_ai.request.max_tokens": generation.max_tokens,
        "gen_ai.request.temperature": generation.temperature,
        "gen_ai.request.top_p": generation.top_p,
        "gen_ai.request.seed": generation.seed,
        "evalstream.batch.size": batch_size,
    }
    with tracer().start_as_current_span(
        f"chat {name or model}",
        kind=SpanKind.CLIENT if remote else SpanKind.INTERNAL,
        attributes=attributes,
    ) as span:
        yield span


def record_usage(span: Span, outputs: Sequence[Any]) -> None:
    """Token usage of a batch's answers (outputs that are errors count as errors)."""
    answers = [o for o in outputs if not isinstance(o, BaseException)]
    span.set_attribute("gen_ai.usage.input_tokens", sum(getattr(o, "prompt_tokens", 0) or 0 for o in answers))
    span.set_attribute(
        "gen_ai.usage.output_tokens", sum(getattr(o, "completion_tokens", 0) or 0 for o in answers)
    )
    if len(answers) < len(outputs):
        span.set_attribute("evalstream.batch.errors", len(outputs) - len(answers))
        span.set_status(Status(StatusCode.ERROR, "some items failed"))


def current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None
