"""Heartbeats: every HEARTBEAT_INTERVAL_S the worker tells the routers (eval.heartbeats,
keyed by worker id) its status, queue depth, latency, error rate and device metrics, and
sets the device gauges of its /metrics from the same sample."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from faststream.kafka import KafkaBroker

from evalstream.common import topics
from evalstream.common.messages import Heartbeat, WorkerStatus, encode
from evalstream.common.metrics import (
    CPU_UTILIZATION,
    GPU_MEMORY_FREE,
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_TEMPERATURE,
    GPU_UTILIZATION,
    HOST_MEMORY_AVAILABLE,
    WORKER_HEARTBEAT,
)
from evalstream.common.settings import WorkerSettings
from evalstream.common.tasks import cancel_and_wait
from evalstream.worker.engine_registry import Engines
from evalstream.worker.gpu import DeviceMetrics, sample_device_metrics
from evalstream.worker.state import WorkerState

log = logging.getLogger("evalstream.worker")


def set_device_gauges(m: DeviceMetrics) -> None:
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


class Heartbeats:
    def __init__(
        self,
        broker: KafkaBroker,
        settings: WorkerSettings,
        worker_id: str,
        state: WorkerState,
        engines: Engines,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.worker_id = worker_id
        self.state = state
        self.engines = engines
        self._loop: asyncio.Task[None] | None = None

    async def send(self, status: WorkerStatus) -> None:
        runner = self.state.runner
        m = await asyncio.to_thread(sample_device_metrics)
        p50, p95, tps, err = runner.take_stats() if runner else (0.0, 0.0, 0.0, 0.0)
        hb = Heartbeat(
            worker_id=self.worker_id,
            group=self.settings.worker_group,
            model=self.settings.worker_model,
            ts=time.time(),
            device=self.engines.device if self.engines.device != "cpu" else m.device,
            queue_depth=self.state.in_flight,
            latency_p50_ms=p50,
            latency_p95_ms=p95,
            tokens_per_s=tps,
            error_rate=err,
            status=status,
            **m.heartbeat_fields(),
        )
        set_device_gauges(m)
        await self.broker.publish(encode(hb), topics.HEARTBEATS, key=self.worker_id.encode())
        # Only once it is on the broker: the "group without heartbeats" alert reads this.
        WORKER_HEARTBEAT.labels(worker_group=self.settings.worker_group, worker_id=self.worker_id).set(hb.ts)

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.send(self.state.status())
            except Exception:
                log.exception("heartbeat failed")
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def stop_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop:
            await cancel_and_wait(loop, "the heartbeat loop")

    async def say_stopped(self) -> None:
        """Before the broker disconnects: tell the routers we are gone, so they stop routing here."""
        self.state.draining = True
        await self.stop_loop()
        with contextlib.suppress(Exception):
            await self.send("stopped")
