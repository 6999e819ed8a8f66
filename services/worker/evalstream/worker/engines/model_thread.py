"""One thread of the process runs every model's work (loading, passes, the log-softmax).

torch parallelises an operation over an OpenMP team, and libgomp gives each thread that
starts a parallel region a team of its own. Engine calls arrive on whichever thread of
asyncio's pool is free, so a worker soon holds several teams; once their threads outnumber the
cores, libgomp stops spinning at its barriers and sleeps at each one ("throttled" spinning),
and every pass waits on wake-ups: the same scoring ran 1.4-1.9x slower from a second thread
than from the first on 2 cores (measured, 43,732 voluntary context switches against 21).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
_thread_ids: set[int] = set()


def _mark() -> None:
    _thread_ids.add(threading.get_ident())


_executor.submit(_mark).result()


def on_model_thread(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """fn(*args, **kwargs) on the model thread, waiting for it (at once when already there)."""
    if threading.get_ident() in _thread_ids:
        return fn(*args, **kwargs)
    return _executor.submit(fn, *args, **kwargs).result()
