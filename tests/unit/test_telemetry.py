"""Tracing and structured logs as pure functions (an in-memory span exporter, no collector):
trace context through Kafka headers, per-record consumer spans of batch handlers, the GenAI
engine span, and JSON log lines carrying run and trace ids. tests/e2e/test_tracing.py shows
the whole trace across the four services."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from faststream import ContextRepo
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from evalstream.common import logs, service, telemetry
from evalstream.common.messages import GenerationParams


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "_provider", provider)
    yield exporter


def record(topic: str, key: str, offset: int, headers: list[tuple[str, bytes]]) -> Any:
    return SimpleNamespace(topic=topic, partition=2, offset=offset, key=key.encode(), headers=headers)


def test_trace_context_round_trips_through_kafka_headers(spans: InMemorySpanExporter) -> None:
    with telemetry.send_span("eval.jobs", "run-1") as headers:
        pass
    (name, value), *_ = headers
    assert name == "traceparent" and value.decode().startswith("00-")
    (sent,) = spans.get_finished_spans()
    assert sent.kind == SpanKind.PRODUCER and sent.name == "send eval.jobs"
    assert sent.attributes is not None and sent.attributes["messaging.destination.name"] == "eval.jobs"
    ctx = telemetry.extract(headers)
    from opentelemetry import trace

    remote = trace.get_current_span(ctx).get_span_context()
    assert (remote.trace_id, remote.span_id) == (sent.context.trace_id, sent.context.span_id)


def test_batch_records_each_continue_their_own_trace(spans: InMemorySpanExporter) -> None:
    with telemetry.send_span("eval.work.g", "run-a") as ha:
        pass
    with telemetry.send_span("eval.work.g", "run-b") as hb:
        pass
    parent_a, parent_b = spans.get_finished_spans()
    spans.clear()
    records = [
        record("eval.work.g", "run-a", 10, ha),
        record("eval.work.g", "run-b", 11, hb),
        record("eval.work.g", "run-b", 12, []),
    ]
    seen_trace = None
    with telemetry.consume_spans(records, "evalstream-worker-g") as made:
        assert len(made) == 3
        seen_trace = telemetry.current_trace_id()
        with telemetry.engine_span("null", GenerationParams(max_tokens=16), batch_size=3) as engine:
            telemetry.record_usage(
                engine, [SimpleNamespace(prompt_tokens=5, completion_tokens=2), RuntimeError("x")]
            )
    finished = {
        s.name + str((s.attributes or {}).get("messaging.kafka.offset", "")): s
        for s in spans.get_finished_spans()
    }
    a, b, orphan = (
        finished["process eval.work.g10"],
        finished["process eval.work.g11"],
        finished["process eval.work.g12"],
    )
    assert a.parent is not None and a.parent.span_id == parent_a.context.span_id
    assert a.context.trace_id == parent_a.context.trace_id
    assert b.parent is not None and b.parent.span_id == parent_b.context.span_id
    assert orphan.parent is None  # no headers: a trace of its own
    assert [link.context.span_id for link in b.links] == [a.context.span_id]
    assert a.kind == SpanKind.CONSUMER and a.attributes is not None
    assert (
        a.attributes["evalstream.run_id"] == "run-a"
        and a.attributes["messaging.consumer.group.name"] == "evalstream-worker-g"
    )
    assert seen_trace == format(a.context.trace_id, "032x")  # the first record's span is current
    engine_span = finished["chat null"]
    assert engine_span.parent is not None and engine_span.parent.span_id == a.context.span_id
    attrs = engine_span.attributes or {}
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "evalstream.null"
    assert (
        attrs["gen_ai.usage.input_tokens"],
        attrs["gen_ai.usage.output_tokens"],
        attrs["evalstream.batch.errors"],
    ) == (5, 2, 1)
    assert attrs["gen_ai.request.max_tokens"] == 16


def test_a_failing_batch_marks_every_record_span(spans: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError), telemetry.consume_spans([record("eval.results", "r", 1, [])], "agg"):
        raise ValueError("database down")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR" and span.events[0].name == "exception"


def test_heartbeat_traces_are_not_sampled() -> None:
    sampler = telemetry._QuietSampler()
    assert not sampler.should_sample(None, 1, "eval.heartbeats publish").decision.is_sampled()
    assert sampler.should_sample(None, 1, "eval.shards publish").decision.is_sampled()


def json_lines(run: Any) -> list[dict[str, Any]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("worker"))
    logger = logging.getLogger("evalstream.test_telemetry")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        run(logger)
    finally:
        logger.removeHandler(handler)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_logs_carry_run_shard_and_trace_ids(spans: InMemorySpanExporter) -> None:
    def run(log: logging.Logger) -> None:
        log.info("outside")
        with (
            logs.bind(run_id="run-9", shard_id="run-9:0003"),
            telemetry.consume_spans([record("t", "run-9", 1, [])], "g"),
        ):
            log.warning("inside %s", "a batch", extra={"item_id": "q1"})
        try:
            raise KeyError("boom")
        except KeyError:
            log.exception("failed")

    outside, inside, failed = json_lines(run)
    assert outside["msg"] == "outside" and "run_id" not in outside and "trace_id" not in outside
    assert (
        inside["msg"] == "inside a batch" and inside["level"] == "WARNING" and inside["service"] == "worker"
    )
    assert (inside["run_id"], inside["shard_id"], inside["item_id"]) == ("run-9", "run-9:0003", "q1")
    (span,) = spans.get_finished_spans()
    assert inside["trace_id"] == format(span.context.trace_id, "032x") and len(inside["span_id"]) == 16
    assert "KeyError: 'boom'" in failed["exc"] and failed["ts"].endswith("Z")


async def test_run_id_middleware_binds_the_message_key() -> None:
    seen: list[dict[str, str]] = []

    async def handler(msg: Any) -> None:
        seen.append(logs.bound())

    middleware = service.RunIdMiddleware(None, context=ContextRepo())
    await middleware.consume_scope(handler, SimpleNamespace(raw_message=SimpleNamespace(key=b"run-7")))
    batch = (SimpleNamespace(key=b"run-7"), SimpleNamespace(key=b"run-8"))
    await middleware.consume_scope(handler, SimpleNamespace(raw_message=batch))
    assert seen == [{"run_id": "run-7"}, {}]
