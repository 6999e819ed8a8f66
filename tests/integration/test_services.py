"""Each service's FastStream app starts against the real broker, serves /healthz, /readyz
and /metrics, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import urllib.request

import pytest

from evalstream.common.settings import Settings
from tests.support import unique

pytestmark = pytest.mark.stack


def get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.read().decode()


@pytest.mark.parametrize("module", ["producer", "router", "aggregator", "worker"])
def test_service_answers_health_and_stops_on_sigterm(stack: Settings, spawn, module: str) -> None:
    # A worker of a group of its own with the null engine: no model to load, no shards taken.
    env = {"WORKER_GROUP": unique("health"), "WORKER_MODEL": "null"} if module == "worker" else {}
    proc, port = spawn(f"evalstream.{module}", **env)
    proc.wait_healthy(port, timeout=120)
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    status, metrics = get(port, "/metrics")
    assert status == 200 and "process_cpu_seconds_total" in metrics
    proc.signal(signal.SIGTERM)
    assert proc.proc is not None
    # uvicorn re-raises the signal once shutdown is complete, so the exit status says SIGTERM
    assert proc.proc.wait(60) in (0, -signal.SIGTERM)
    log = proc.log.read_text()
    assert "FastStream app shut down gracefully" in log and "Application shutdown complete" in log, log[
        -2000:
    ]
    assert "Traceback" not in log, log[-2000:]


def test_worker_whose_model_cannot_load_stops_with_an_error(stack: Settings, spawn, tmp_path) -> None:
    """The model loads while the worker connects and joins its group; when it cannot load,
    the worker says why, shuts down gracefully (it took no shard) and exits non-zero."""
    missing = tmp_path / "no-such-model"
    proc, _ = spawn("evalstream.worker", WORKER_GROUP=unique("badmodel"), WORKER_MODEL=f"hf:{missing}")
    assert proc.proc is not None
    assert proc.proc.wait(90) == 3
    log = proc.log.read_text()
    assert f"model 'hf:{missing}' cannot be loaded: EngineConfigError" in log, log[-2000:]
    assert "Application shutdown complete" in log, log[-2000:]
