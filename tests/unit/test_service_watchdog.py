"""A service whose event loop stops turning prints every thread's stack (service.run's
watchdog), so a process that ignores SIGTERM says where it is stuck."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from evalstream.common import service


class _Server:
    def __init__(self, blocking_s: float, turning_s: float) -> None:
        self.blocking_s, self.turning_s = blocking_s, turning_s

    async def serve(self) -> None:
        await asyncio.sleep(0.05)  # the watchdog has armed its timer
        time.sleep(self.blocking_s)  # noqa: ASYNC251 - the blocking call on the loop under test
        await asyncio.sleep(self.turning_s)


def serve(server: Any) -> None:
    asyncio.run(service._serve_watched(server))


def test_a_loop_stuck_past_the_limit_prints_the_stack_of_the_blocking_call(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(service, "STALL_DUMP_S", 0.3)
    serve(_Server(blocking_s=1.0, turning_s=0.0))
    err = capfd.readouterr().err
    assert "Timeout (0:00:00.300000)!" in err
    assert "in serve" in err and "test_service_watchdog.py" in err


def test_a_loop_that_keeps_turning_prints_nothing(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(service, "STALL_DUMP_S", 0.3)
    serve(_Server(blocking_s=0.1, turning_s=1.0))
    assert "Timeout" not in capfd.readouterr().err
