"""Each service's series exist at 0 from its start (metrics.start_series): a series a scrape
first sees above 0 hides that count from rate() and increase()."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json
from prometheus_client import REGISTRY
from evalstream.common import metrics
def read():
    return {
        "engine": REGISTRY.get_sample_value("evalstream_stage_latency_seconds_count", {"stage": "engine"}),
        "end_to_end": REGISTRY.get_sample_value("evalstream_stage_latency_seconds_count", {"stage": "end_to_end"}),
        "retried": REGISTRY.get_sample_value("evalstream_items_total", {"service": "worker", "status": "retried"}),
    }
before = read()
metrics.start_series("worker-gpu-a")
print(json.dumps([before, read()]))
"""


def test_a_worker_starts_its_own_series_at_zero_and_no_other_service_s() -> None:
    # a fresh interpreter: the registry of this one already holds other tests' series
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    before, after = json.loads(out.stdout)
    assert before == {"engine": None, "end_to_end": None, "retried": None}
    assert after == {"engine": 0.0, "end_to_end": None, "retried": 0.0}
