"""A rate-limited OpenAI-compatible provider for the benchmarks (tests/fakes/limited_provider.py
in a process of its own), and how much of its limit an arm used, from its own counts."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from typing import Any

from bench.harness import benchstack, paths


class Provider:
    """tests/fakes/limited_provider.py as a process on 127.0.0.1:<port>."""

    def __init__(self, port: int, rps: float, rpm: float) -> None:
        self.port, self.rps, self.rpm = port, rps, rpm
        self.url = f"http://127.0.0.1:{port}/v1"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise SystemExit(f"port {port} is taken: another provider left running?")
        (benchstack.stack_dir() / "logs").mkdir(parents=True, exist_ok=True)
        self.log = (benchstack.stack_dir() / "logs" / "bench-provider.log").open("a")
        self.proc = subprocess.Popen(
            [
                str(paths.PY),
                "-m",
                "tests.fakes.limited_provider",
                "--port",
                str(port),
                "--rps",
                str(rps),
                "--rpm",
                str(rpm),
            ],
            cwd=paths.ROOT,
            stdout=self.log,
            stderr=self.log,
        )
        benchstack.wait_http(f"{self.url}/models", timeout=60)

    def reset(self) -> None:
        """Counts cleared, buckets full."""
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/stats", method="POST"), timeout=5).read()

    def stats(self) -> dict[str, Any]:
        return dict(json.loads(benchstack.http_get(f"{self.url}/stats")))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def usage(
    stats: dict[str, Any], items: int, t0: float, t1: float, rps: float, burst: float
) -> dict[str, Any]:
    """How much of the provider's limit an arm that ran from `t0` to `t1` (time.monotonic,
    the provider's clock too) used, from the provider's own counts."""
    admitted, requests = stats["admitted_prompts"], stats["requests"]
    span = (stats["last_admitted"] - stats["first_admitted"]) if admitted else 0.0
    wall_s = t1 - t0
    return {
        "wall_s": round(wall_s, 2),
        # process start -> first request admitted; last admitted -> process exit
        "before_first_s": round(stats["first_admitted"] - t0, 2) if admitted else None,
        "after_last_s": round(t1 - stats["last_admitted"], 2) if admitted else None,
        "items": items,
        "requests": requests,
        "rate_limited": stats["rate_limited"],
        "share_429": round(stats["rate_limited"] / requests, 4) if requests else None,
        "admitted": admitted,
        "admitted_span_s": round(span, 2),
        # what the provider admits at most in `span`: its burst, then its sustained rate
        "capacity_share": round(admitted / (burst + rps * span), 4) if admitted else None,
        "items_per_s": round(items / wall_s, 3),
        "end_to_end_share": round(items / wall_s / rps, 4),
        "max_in_flight": stats["max_in_flight"],
    }
