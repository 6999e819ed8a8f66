"""TEST-ONLY hooks of the services, never set in production (settings.TestHookSettings).

Crash points (FAULT_INJECT="<name>=N[,<name>=N...]"): a service dies abruptly at the N-th
pass through the named point, as a kill -9 would, so that the fault suite can prove that
what was written but not committed is redelivered safely. Parsed once, at startup.
FAULT_INJECT="worker_fail_item=<item id>" (repeatable) makes the worker's handler fail on
every shard holding that item, so that the fault suite can show a poison shard dead-lettered
after WORKER_MAX_DELIVERIES deliveries.
The engine hooks (ENGINE_FAULTS, ENGINE_DELAY_MS) are the worker's:
worker/engines/testhooks.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

log = logging.getLogger("evalstream.testhooks")
FAILING_ITEM = "worker_fail_item"  # FAULT_INJECT="worker_fail_item=<item id>"


class CrashPoints:
    def __init__(self, spec: str) -> None:
        """Raises ValueError on a malformed FAULT_INJECT."""
        self.after: dict[str, int] = {}
        self.failing_items: frozenset[str] = frozenset()
        for part in spec.split(","):
            if not part.strip():
                continue
            name, eq, count = (s.strip() for s in part.partition("="))
            if name == FAILING_ITEM and count:
                self.failing_items |= {count}
                continue
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

    def fail_on_items(self, item_ids: Iterable[str], where: str) -> None:
        """Raises RuntimeError when one of `item_ids` is an item FAULT_INJECT says to fail."""
        if self.failing_items and any(i in self.failing_items for i in item_ids):
            raise RuntimeError(f"injected fault: {where} holds a failing item")
