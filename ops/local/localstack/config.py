"""Where the local stack lives (cache, stack folder), its ports, and the small helpers every
part of it uses."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from evalstream.common.settings import SERVICE_PORTS

ROOT = Path(__file__).resolve().parents[3]

CACHE = Path(os.environ.get("EVALSTREAM_CACHE", Path.home() / ".cache" / "evalstream"))
STACK = Path(os.environ.get("EVALSTREAM_STACK", ROOT / ".stack"))
VENV_PY = ROOT / ".venv" / "bin" / "python"

KAFKA_VERSION = "4.4.0"
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
APT_PACKAGES = ["postgresql", "prometheus", "bubblewrap", "chromium"]  # chromium: report tests
# A second stack (the fault-injection suite's, which kills brokers and databases) runs
# beside the development one with every port shifted by EVALSTREAM_PORT_OFFSET.
OFFSET = int(os.environ.get("EVALSTREAM_PORT_OFFSET", "0"))
KAFKA_PORT, KAFKA_CONTROLLER_PORT = 9092 + OFFSET, 9093 + OFFSET
PG_PORT, S3_PORT, PROM_PORT = 5432 + OFFSET, 8333 + OFFSET, 9090 + OFFSET
WEED_PORTS = {"master": 9333 + OFFSET, "volume": 8380 + OFFSET, "filer": 8888 + OFFSET}
PORTS = {name: port + OFFSET for name, port in SERVICE_PORTS.items()}
# The hosts' network (`up --hosts N`, localstack/hosts.py): Kafka's listener for the hosts,
# its listener behind the fault proxy, the proxy's address for it, and the proxy's API.
KAFKA_HOSTS_PORT, KAFKA_PROXIED_PORT = 9094 + OFFSET, 9096 + OFFSET
PROXY_KAFKA_PORT, TOXIPROXY_PORT = 9095 + OFFSET, 8474 + OFFSET
TOXIPROXY_VERSION = "v2.5.0"


def log(msg: str) -> None:
    print(f"[stack] {msg}", flush=True)


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError):
        return False


def wait_for(what: str, check: Callable[[], bool], timeout: float, logfile: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    where = f"; its log: {logfile}" if logfile else ""
    tail = ""
    if logfile and logfile.exists():
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
    raise SystemExit(f"[stack] {what} did not become healthy within {timeout:.0f}s{where}\n{tail}")
