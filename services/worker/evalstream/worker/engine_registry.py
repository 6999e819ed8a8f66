"""The engines of the SPECs a worker group serves, loaded on first use and kept."""

from __future__ import annotations

from evalstream.common.metrics import ENGINE_REQUESTS
from evalstream.common.settings import WorkerSettings
from evalstream.common.specs import serves
from evalstream.worker.engines import load_engine
from evalstream.worker.engines.base import Engine, PermanentEngineError
from evalstream.worker.engines.testhooks import EngineTestHooks


class Engines:
    """Callable as `engines(spec)`: the loaded engine of `spec` (blocking while it loads).
    A SPEC outside the group's WORKER_MODEL patterns is a permanent failure of its items."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.test_hooks = EngineTestHooks.from_settings(settings)
        self._loaded: dict[str, Engine] = {}

    def __call__(self, spec: str) -> Engine:
        engine = self._loaded.get(spec)
        if engine is None:
            if not serves(self.settings.worker_model, spec):
                raise PermanentEngineError(
                    f"group {self.settings.worker_group} does not serve model {spec!r}"
                )
            engine = self.test_hooks.wrap(load_engine(spec, self.settings))
            self._loaded[spec] = engine
            # at 0 from its load: a scrape before its first batch lets rate() see that batch
            ENGINE_REQUESTS.labels(model=engine.name)
        return engine

    def close(self) -> None:
        for engine in self._loaded.values():
            engine.close()

    @property
    def device(self) -> str:
        """The first accelerator any loaded engine runs on, else "cpu"."""
        return next((e.device for e in self._loaded.values() if e.device != "cpu"), "cpu")
