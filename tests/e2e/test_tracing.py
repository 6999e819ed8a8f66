"""Issue 7: one connected trace from `evalctl submit` through producer, router, worker and
aggregator, received by an OTLP/HTTP collector running inside the test.

The four services are spawned by the test with KAFKA_TOPIC_PREFIX set: a pipeline of its
own on the shared broker (own topics, own consumer groups), so that no message of this run
can be taken by the stack's services, which export nowhere. Nothing is left to chance: the
run is also pinned to the test's own worker group.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from evalstream.common.settings import Settings
from tests.e2e.helpers import ROOT, arithmetic_items, write_jsonl
from tests.support import admin_kafka, credentials_env, unique

pytestmark = pytest.mark.stack

SERVICES = ("producer", "router", "worker", "aggregator")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Collector:
    """Accepts OTLP/HTTP protobuf on /v1/traces and keeps every span, flattened."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ok = self.path == "/v1/traces"
                if ok:
                    collector.add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        flat = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    flat.append(
                        {
                            "service": resource.get("service.name"),
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex() or None,
                            "name": s.name,
                            "kind": s.kind,
                            "attributes": {a.key: _value(a.value) for a in s.attributes},
                            "links": [link.span_id.hex() for link in s.links],
                        }
                    )
        with self.lock:
            self.spans += flat

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()


async def _delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AIOKafkaAdminClient(**admin_kafka())
    await admin.start()
    try:
        ours = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if ours:
            await admin.delete_topics(ours)
    finally:
        await admin.close()


async def test_one_connected_trace_from_submit_to_aggregator(
    stack: Settings, spawn: Any, collector: Collector, tmp_path: Path
) -> None:
    prefix = unique("trace") + "."
    group = "traced"
    env = {
        "KAFKA_TOPIC_PREFIX": prefix,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "WORKER_GROUP": group,
        "WORKER_GROUPS": group,
        "WORKER_MODEL": "null",
    }
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    boot = subprocess.run(  # topics and the ACLs of the prefixed names: the admin's job
        [sys.executable, "-m", "evalstream.common.bootstrap"],
        env={**full_env, **credentials_env("admin")},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert boot.returncode == 0, boot.stderr
    procs: dict[str, Any] = {}
    try:
        procs = {name: spawn(f"evalstream.{name}", **env) for name in SERVICES}
        for proc, port in procs.values():
            proc.wait_healthy(port, timeout=120)
        dataset = write_jsonl(tmp_path / "traced.jsonl", arithmetic_items(6, prefix="t"))
        submit = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "evalstream.cli",
                "submit",
                str(dataset),
                "--model",
                "null",
                "--worker-group",
                group,
                "--shard-size",
                "3",
                "--wait",
                "--json",
                "--timeout",
                "120",
            ],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
        )
        assert submit.returncode == 0, submit.stderr[-3000:]
        summary = json.loads(submit.stdout.strip().splitlines()[-1])
        run_id = summary["run_id"]
        assert summary["status"] == "completed" and summary["recorded"] == 6

        # evalctl's send span starts the trace; the services flush every 0.5 s.
        roots = [
            s
            for s in collector.spans
            if s["service"] == "evalstream-evalctl" and s["attributes"].get("evalstream.run_id") == run_id
        ]
        assert len(roots) == 1, collector.spans[:5]
        root = roots[0]
        assert root["parent"] is None and root["name"] == f"send {prefix}eval.jobs"
        trace_id = root["trace_id"]
        wanted = {
            "evalstream-producer",
            "evalstream-router",
            f"evalstream-worker-{group}",
            "evalstream-aggregator",
        }
        for _ in range(100):
            spans = collector.trace(trace_id)
            if (
                wanted <= {s["service"] for s in spans}
                and sum(
                    s["service"] == "evalstream-aggregator" and s["name"].startswith("process") for s in spans
                )
                >= 2
            ):
                break
            await asyncio.sleep(0.1)
        spans = collector.trace(trace_id)
        by_id = {s["span_id"]: s for s in spans}
        assert wanted <= {s["service"] for s in spans}, sorted({s["service"] for s in spans})

        # Connected: every span but the root has its parent in the same trace.
        orphans = [s for s in spans if s["parent"] is not None and s["parent"] not in by_id]
        assert not orphans, orphans
        assert [s for s in spans if s["parent"] is None] == [root]

        # Each aggregator span for the run leads back to the submit through every service.
        ends = [
            s
            for s in spans
            if s["service"] == "evalstream-aggregator" and s["name"] == f"process {prefix}eval.results"
        ]
        assert len(ends) == 2  # two shards of three items, one result message each
        for end in ends:
            chain: list[str] = []
            s: dict[str, Any] | None = end
            while s is not None:
                chain.append(s["service"])
                s = by_id.get(s["parent"]) if s["parent"] else None
            assert chain[-1] == "evalstream-evalctl"
            hops = [svc for i, svc in enumerate(chain) if i == 0 or chain[i - 1] != svc]
            assert hops == [
                "evalstream-aggregator",
                f"evalstream-worker-{group}",
                "evalstream-router",
                "evalstream-producer",
                "evalstream-evalctl",
            ], chain
            assert end["kind"] == 5  # SPAN_KIND_CONSUMER
            assert end["attributes"]["messaging.system"] == "kafka"
            assert end["attributes"]["evalstream.run_id"] == run_id

        # The engine span follows the GenAI conventions and nests in a worker shard span.
        engine = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
        assert engine, [s["name"] for s in spans]
        for e in engine:
            a = e["attributes"]
            assert e["name"] == "chat null" and a["gen_ai.request.model"] == "null"
            assert a["gen_ai.provider.name"] == "evalstream.null"
            assert a["gen_ai.usage.input_tokens"] > 0 and "gen_ai.usage.output_tokens" in a
            parent = by_id[e["parent"]]
            assert parent["name"] == f"process {prefix}eval.work.{group}"
            assert (
                parent["attributes"]["evalstream.shard_id"].startswith(run_id)
                or parent["attributes"]["evalstream.run_id"] == run_id
            )

        # The structured logs carry the same ids: the aggregator's completion line.
        aggregator_log = procs["aggregator"][0].log.read_text()
        lines = [json.loads(line) for line in aggregator_log.splitlines() if line.startswith("{")]
        done = [line for line in lines if line.get("run_id") == run_id and "completed" in line["msg"]]
        assert done, aggregator_log[-2000:]
        assert done[0]["trace_id"] == trace_id and done[0]["service"] == "aggregator"
        assert {"ts", "level", "logger", "span_id"} <= set(done[0])
    finally:
        # Services first: deleting the topics under them would slow their shutdown down.
        await asyncio.gather(*(asyncio.to_thread(proc.stop) for proc, _ in procs.values()))
        await _delete_topics(stack.kafka_bootstrap, prefix)
