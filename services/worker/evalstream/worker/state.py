"""The worker's state: the main model's load (a small state machine: loading -> ready, or
a shutdown with an error) and what the heartbeats report."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from evalstream.common import service
from evalstream.common.messages import WorkerStatus
from evalstream.worker.engine_registry import Engines, main_model
from evalstream.worker.runner import ModelRunner

log = logging.getLogger("evalstream.worker")


class ModelLoad:
    """Loads the group's main model in a thread from startup on (or adopts the load the
    worker's entry point started before the service's imports: Engines.preload). Shards wait
    for it (`wait`); a model that cannot load shuts the worker down with an error."""

    def __init__(self, engines: Engines, worker_model: str) -> None:
        self.engines = engines
        self.spec = main_model(worker_model)
        self.ready = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._load())
        self._task.add_done_callback(self._loaded)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait(self) -> None:
        """Returns once the main model is loaded (raises if it cannot be)."""
        if self._task is None:
            raise RuntimeError("the model load has not started (lifespan not entered)")
        await asyncio.shield(self._task)

    async def loaded(self) -> bool:
        """The readiness check: the main model is loaded."""
        return self.ready

    async def _load(self) -> None:
        if self.spec:  # the load logs its own time (Engines._preload)
            await asyncio.wrap_future(self.engines.preload(self.spec))

    def _loaded(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if exc := task.exception():
            service.shut_down_with_error(f"model {self.spec!r} cannot be loaded: {exc!r}")
        else:
            self.ready = True


@dataclass
class WorkerState:
    """What the worker's subscriber, heartbeats and lifecycle hooks share."""

    model: ModelLoad
    runner: ModelRunner | None = None  # made by the lifespan, once the database pool is
    consuming: bool = False  # the subscriber has joined its group
    draining: bool = False  # shutdown has begun
    in_flight: int = 0  # shards of the round being run

    async def mark_consuming(self) -> None:
        """After startup: the subscriber has joined its group."""
        self.consuming = True

    def status(self) -> WorkerStatus:
        """What heartbeats say: routers send shards to starting and ready workers alike."""
        if self.draining:
            return "draining"
        return "ready" if self.model.ready and self.consuming else "starting"
