"""TEST-ONLY hooks of the services, never set in production (settings.TestHookSettings).

Crash points (FAULT_INJECT="<name>=N[,<name>=N...]"): a service dies abruptly at the N-th
pass through the named point, as a kill -9 would, so that the fault suite can prove that
what was written but not committed is redelivered safely. Parsed once, at startup.
The engine hooks (ENGINE_FAULTS, ENGINE_DELAY_MS) are the worker's:
worker/engines/testhooks.py.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("evalstream.testhooks")


class CrashPoints:
    def __init__(self, spec: str) -> None:
        """Raises ValueError on a malformed FAULT_INJECT."""
        self.after: dict[str, int] = {}
        for part in spec.split(","):
            if not part.strip():
                continue
            name, eq, count = (s.strip() for s in part.partition("="))
            if not eq or not name or not count.isdigit() or int(count) < 1:
                raise ValueError(f"FAULT_INJECT {spec!r}: expected <name>=<count ≥ 1>, got {part.strip()!r}")
            self.after[name] = int(count)
        self._passes: dict[str, int] = {}

    def reach(self, name: str) -> None:
        """A pass through crash point `name`: exits the process (status 137, no cleanup)
        when it is the N-th one FAULT_INJECT asks for."""
        if name not in self.after:
            return
        self._passes[name] = self._passes.get(name, 0) + 1
        if self._passes[name] >= self.after[name]:
            log.warning("fault injection: exiting at %s #%d", name, self._passes[name])
            os._exit(137)
