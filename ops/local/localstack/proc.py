"""A background process of the stack, with a pid file and a log in the stack folder."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localstack.config import ROOT, STACK, log, wait_for


@dataclass
class Proc:
    """A background process with a pid file and a log in the stack folder."""

    name: str
    argv: Callable[[], list[str]]
    healthy: Callable[[], bool]
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None

    @property
    def pidfile(self) -> Path:
        return STACK / "run" / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return STACK / "logs" / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        # A stale pid file may name a reused pid: a zombie or another program is not ours.
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                return None
        except OSError:
            return None
        return pid

    def start(self) -> bool:
        """Starts the process unless it already runs; returns True if it was started."""
        if self.pid() is not None:
            return False
        if self.prepare:
            self.prepare()
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        with self.logfile.open("ab") as out:
            p = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
                cwd=ROOT,
            )
        self.pidfile.write_text(str(p.pid))
        return True

    def wait_healthy(self) -> None:
        def check() -> bool:
            if self.pid() is None:
                raise SystemExit(
                    f"[stack] {self.name} exited during start; its log: {self.logfile}\n"
                    + "\n".join(self.logfile.read_text(errors="replace").splitlines()[-20:])
                )
            return self.healthy()

        wait_for(self.name, check, self.timeout, self.logfile)

    def stop(self, timeout: float = 30.0) -> None:
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            log(f"{self.name} did not stop in {timeout:.0f}s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)
