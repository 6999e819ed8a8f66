"""The engines of the SPECs a worker group serves, loaded on first use and kept; the group's
main model preloaded from the process's first moments (`preload`)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from evalstream.common.settings import WorkerSettings
from evalstream.worker.engines import check_served, load_engine, resolve_spec
from evalstream.worker.engines.base import Engine
from evalstream.worker.engines.testhooks import EngineTestHooks

log = logging.getLogger("evalstream.worker")


def main_model(worker_model: str) -> str | None:
    """The group's main model: the first SPEC of WORKER_MODEL that is not a pattern."""
    return next((s.strip() for s in worker_model.split(",") if "*" not in s and s.strip()), None)


class Engines:
    """Callable as `engines(spec)`: the loaded engine of `spec` (blocking while it loads).
    A SPEC outside the group's WORKER_MODEL patterns is a permanent failure of its items. A
    bundled model's name shares the engine it resolves to (`ov:<name>` on a CPU) with jobs
    that name that engine."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.test_hooks = EngineTestHooks.from_settings(settings)
        self._loaded: dict[str, Engine] = {}  # by the SPEC asked for and by the engine's own
        self._preloads: dict[str, Future[Engine]] = {}
        self._lock = threading.Lock()

    def preload(self, spec: str) -> Future[Engine]:
        """Starts loading `spec` in a thread of its own, once (later calls return the same
        future); `engines(spec)` waits for it. The worker preloads its main model before it
        imports its service stack, so that OpenVINO's compile (or torch's read) of the weights
        runs beside those imports, the broker connection and the group join, not after them."""
        with self._lock:
            future = self._preloads.get(spec)
            if future is None:
                future = self._preloads[spec] = Future()
                threading.Thread(
                    target=self._preload, args=(spec, future), name="model-load", daemon=True
                ).start()
        return future

    def _preload(self, spec: str, future: Future[Engine]) -> None:
        started = time.monotonic()
        log.info("loading the main model %s", spec)
        try:
            engine = self._load(spec)
        except BaseException as exc:  # the waiter (state.ModelLoad) shuts the worker down with it
            future.set_exception(exc)
            return
        log.info(
            "engine %s loaded in %.1fs on %s: %s",
            spec,
            time.monotonic() - started,
            engine.device,
            engine.name,
        )
        future.set_result(engine)

    def __call__(self, spec: str) -> Engine:
        engine = self._loaded.get(spec)
        if engine is not None:
            return engine
        future = self._preloads.get(spec)
        return future.result() if future is not None else self._load(spec)

    def _load(self, spec: str) -> Engine:
        check_served(spec, self.settings)  # before a loaded engine is found for it
        engine = self._loaded.get(resolve_spec(spec, self.settings).text)
        if engine is None:
            from evalstream.common.metrics import ENGINE_REQUESTS  # not before the preload starts

            engine = self.test_hooks.wrap(load_engine(spec, self.settings))
            self._loaded[engine.name] = engine
            # at 0 from its load: a scrape before its first batch lets rate() see that batch
            ENGINE_REQUESTS.labels(model=engine.name)
        self._loaded[spec] = engine
        return engine

    def close(self) -> None:
        for engine in {id(e): e for e in self._loaded.values()}.values():
            engine.close()

    @property
    def device(self) -> str:
        """The first accelerator any loaded engine runs on, else "cpu"."""
        return next((e.device for e in self._loaded.values() if e.device != "cpu"), "cpu")


_shared: Engines | None = None
_shared_lock = threading.Lock()


def shared_engines(settings: WorkerSettings) -> Engines:
    """This process's engines (the worker's entry point preloads into them before the app
    module makes its own; the app takes these)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Engines(settings)
        return _shared
