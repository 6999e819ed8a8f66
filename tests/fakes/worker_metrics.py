"""Reading a spawned service's Prometheus metrics (GET /metrics) in tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric_total(port: int, name: str, **labels: str) -> float:
    """Sum of the samples of `name` (e.g. "evalstream_api_retries_total") whose labels
    include `labels`; 0.0 when there are none yet."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
