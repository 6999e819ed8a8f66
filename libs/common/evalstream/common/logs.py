"""Structured logs: one JSON object per line, with the run, shard and trace ids of the work
being done, so that a log line leads to its trace and to its run's results.

Ids come from three places, most specific first: the record's `extra` (`log.info(...,
extra={"run_id": r})`), the ids bound for the current task with `bind(...)` (the Kafka
middleware in service.make_broker binds the run id of every message it hands to a handler),
and the current OpenTelemetry span (trace_id, span_id).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from evalstream.common.redact import redact

# Ids of the work in progress, per asyncio task (contextvars are copied into tasks and
# threads started with asyncio.to_thread, so a handler's ids follow its work).
_BOUND: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("evalstream_log_ids", default={})  # noqa: B039

# Extra fields worth keeping when a caller or library (FastStream: topic, group_id,
# message_id) passes them; everything else on a LogRecord is logging's own bookkeeping.
EXTRA_FIELDS = ("run_id", "shard_id", "item_id", "worker_id", "topic", "group_id", "message_id")


@contextmanager
def bind(**ids: str | None) -> Iterator[None]:
    """Adds ids to every log line written inside the block (None values are ignored)."""
    token = _BOUND.set({**_BOUND.get(), **{k: v for k, v in ids.items() if v}})
    try:
        yield
    finally:
        _BOUND.reset(token)


def bound() -> dict[str, str]:
    return dict(_BOUND.get())


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": redact(record.getMessage()),  # a DATABASE_URL in an error stays unprinted
        }
        if self.service:
            entry["service"] = self.service
        entry.update(_BOUND.get())
        for name in EXTRA_FIELDS:
            value = record.__dict__.get(name)
            if value not in (None, ""):
                entry[name] = value
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            entry["trace_id"] = format(ctx.trace_id, "032x")
            entry["span_id"] = format(ctx.span_id, "016x")
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exc"] = redact(record.exc_text)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(level: str | int = "INFO", service: str | None = None) -> None:
    """JSON lines on stderr for the root logger; libraries that install handlers of their
    own (uvicorn with a log_config, FastStream's default loggers) are given ours instead."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "faststream", "faststream.access.kafka"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
