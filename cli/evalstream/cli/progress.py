"""A progress bar on stderr that needs no dependency: redrawn in place on a terminal, a
line every few seconds otherwise (CI logs)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, label: str, *, width: int = 30, stream=sys.stderr) -> None:
        self.label = label
        self.width = width
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._last_line = 0.0

    def update(self, done: int, total: int | None, extra: str = "") -> None:
        elapsed = time.monotonic() - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        if total:
            frac = min(1.0, done / total)
            filled = int(frac * self.width)
            bar = "#" * filled + "-" * (self.width - filled)
            eta = f" eta {((total - done) / rate):.0f}s" if rate > 0 and done < total else ""
            line = f"{self.label} [{bar}] {done}/{total} {frac:6.1%} {rate:.1f} items/s{eta} {extra}"
        else:
            line = f"{self.label} {extra}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
        elif time.monotonic() - self._last_line >= 5.0 or (total and done >= total):
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = time.monotonic()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
