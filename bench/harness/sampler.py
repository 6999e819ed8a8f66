"""A small sampling profiler for the stack's services (py-spy is not installed).

    python bench/harness/sampler.py --out PREFIX [--interval 0.005] -m evalstream.worker

runs the module as `python -m` would, and every INTERVAL samples the stack of every Python
thread from a background thread (pyinstrument's CLI sees only the main thread, and the
worker's item handling runs in asyncio.to_thread). A sample counts only if the thread is
running: it used CPU since the last sample (/proc/self/task/<tid>/schedstat) and is not
parked in a blocking call (the event loop's select, a thread pool's idle queue, a wait);
so the result is where busy time goes, per stack, across threads. Writes PREFIX.collapsed
(flamegraph input: `frame;frame;frame microseconds`) and PREFIX.json (top functions by self
and inclusive time) every few seconds and at exit; SIGUSR1 forgets what was sampled so far.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

Stack = tuple[str, ...]


# label -> the package whose code it is: "evalstream/<component>", a site-packages
# distribution ("aiokafka"), or "stdlib/<module>"
PACKAGE_OF: dict[str, str] = {}


def package_of(path: str) -> str:
    parts = Path(path).parts
    if "site-packages" in parts:
        i = parts.index("site-packages")
        pkg = parts[i + 1] if i + 1 < len(parts) else "?"
        return pkg.removesuffix(".py")
    if "evalstream" in parts:
        i = len(parts) - 1 - parts[::-1].index("evalstream")
        return "evalstream/" + (parts[i + 1].removesuffix(".py") if i + 1 < len(parts) else "?")
    for i, part in enumerate(parts):
        if part.startswith("python3") and i + 1 < len(parts):
            return "stdlib/" + parts[i + 1].removesuffix(".py")
    return "other"


def frame_label(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    parts = Path(path).parts
    # site-packages/<pkg>/…: keep the package-relative tail, enough to know what it is
    short = "/".join(parts[-3:]) if len(parts) >= 3 else path
    label = f"{code.co_name} ({short}:{code.co_firstlineno})"
    if label not in PACKAGE_OF:
        PACKAGE_OF[label] = package_of(path)
    return label


def owner(stack: Stack) -> str:
    """Whose code a sample is in: the innermost frame outside the standard library (the
    code that asked asyncio, socket or threading to do the work), else the leaf's module."""
    for label in reversed(stack):
        pkg = PACKAGE_OF.get(label, "other")
        if not pkg.startswith(("stdlib/", "other", "<frozen")):
            return pkg
    return PACKAGE_OF.get(stack[-1], "other") if stack else "other"


def stack_of(frame: FrameType | None, limit: int = 80) -> Stack:
    out: list[str] = []
    while frame is not None and len(out) < limit:
        out.append(frame_label(frame))
        frame = frame.f_back
    return tuple(reversed(out))


# (function, file) of the leaf frame of a thread parked in a blocking call (the blocking C
# call itself has no Python frame): the event loop's selector, waits, an idle thread pool.
IDLE_LEAVES = {
    ("select", "selectors.py"),
    ("poll", "selectors.py"),
    ("wait", "threading.py"),
    ("_wait_for_tstate_lock", "threading.py"),
    ("_worker", "thread.py"),
    ("readinto", "socket.py"),  # a blocking read (an HTTP reply) in a worker thread
}


def is_idle(leaf: str) -> bool:
    func, _, where = leaf.partition(" (")
    return (func, Path(where.rsplit(":", 1)[0]).name) in IDLE_LEAVES


def thread_cpu_ns(native_id: int) -> int | None:
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def summarize(stacks: dict[Stack, int], top: int = 25) -> dict[str, object]:
    """Self time (leaf frame) and inclusive time (anywhere on the stack) per function, and
    busy time per package (whose code asked for it)."""
    total = sum(stacks.values()) or 1  # microseconds
    self_t: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    pkgs: collections.Counter[str] = collections.Counter()
    for stack, ns in stacks.items():
        if not stack:
            continue
        self_t[stack[-1]] += ns
        pkgs[owner(stack)] += ns
        for label in set(stack):
            incl[label] += ns
    return {
        "sampled_busy_s": round(total / 1e6, 3),
        "by_package": [{"package": k, "share": round(v / total, 4)} for k, v in pkgs.most_common(12)],
        "self": [{"function": k, "share": round(v / total, 4)} for k, v in self_t.most_common(top)],
        "inclusive": [{"function": k, "share": round(v / total, 4)} for k, v in incl.most_common(top)],
    }


class Sampler:
    def __init__(self, out: Path, interval: float) -> None:
        self.out = out
        self.interval = interval
        self.stacks: collections.Counter[Stack] = collections.Counter()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.reset = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> None:
        self.thread.start()
        atexit.register(self.finish)
        # uvicorn captures SIGTERM, shuts down, restores this handler and raises the signal
        # again: the samples are written then, before the default action ends the process
        signal.signal(signal.SIGTERM, self._on_term)
        # SIGUSR1: forget what was sampled so far (start-up), so that a benchmark profiles
        # only its measured window
        signal.signal(signal.SIGUSR1, lambda *_: self.reset.set())

    def _on_term(self, signum: int, frame: object) -> None:
        self.finish()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _run(self) -> None:
        me = threading.get_ident()
        last: dict[int, int] = {}
        flushed = time.monotonic()
        while not self.stop.wait(self.interval):
            natives = {t.ident: t.native_id for t in threading.enumerate() if t.ident is not None}
            frames = sys._current_frames()
            with self.lock:
                if self.reset.is_set():
                    self.stacks.clear()
                    self.reset.clear()
                for ident, frame in frames.items():
                    nid = natives.get(ident)
                    if ident == me or nid is None:
                        continue
                    ns = thread_cpu_ns(nid)
                    if ns is None:
                        continue
                    used = ns - last.get(nid, ns)
                    last[nid] = ns
                    stack = stack_of(frame)
                    if used > 0 and stack and not is_idle(stack[-1]):
                        self.stacks[stack] += int(self.interval * 1e6)
            del frames
            if time.monotonic() - flushed > 5:
                self.write()
                flushed = time.monotonic()

    def write(self) -> None:
        with self.lock:
            stacks = dict(self.stacks)
        tmp = self.out.with_suffix(".collapsed.tmp")
        tmp.write_text("".join(f"{';'.join(s)} {ns}\n" for s, ns in stacks.items()))
        tmp.replace(self.out.with_suffix(".collapsed"))
        tmp = self.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summarize(stacks), indent=1))
        tmp.replace(self.out.with_suffix(".json"))

    def finish(self) -> None:
        self.stop.set()
        self.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output prefix (PREFIX.collapsed, PREFIX.json)")
    ap.add_argument("--interval", type=float, default=0.005)
    ap.add_argument("-m", dest="module", required=True)
    args, rest = ap.parse_known_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A thread hands the GIL to the sampler only at its next switch check: with the default
    # 5 ms, bursts shorter than that would end in the event loop's select before a sample
    # could see them. A short interval lets samples land inside the busy code.
    sys.setswitchinterval(0.0002)
    Sampler(out, args.interval).start()
    sys.argv = [args.module, *rest]
    # as `python -m`: the working directory first, not this script's folder
    sys.path[0] = os.getcwd()
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
