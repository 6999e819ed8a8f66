"""Prometheus metric names shared across services (one place, so boards and alerts fit).

Latency buckets resolve 10 ms to 60 s.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

ITEMS = Counter(
    "evalstream_items_total",
    "Items by final or intermediate status (succeeded, failed, retried, dead_lettered, cache_hit)",
    ["service", "status"],
)
STAGE_LATENCY = Histogram(
    "evalstream_stage_latency_seconds",
    "Latency per pipeline stage (queue_wait, engine, grading, end_to_end)",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
DEAD_LETTERED = Counter("evalstream_dead_letters_total", "Messages sent to eval.dlq", ["topic", "reason"])
SHARDS = Counter("evalstream_shards_total", "Shards handled", ["service", "outcome"])
RUNS = Counter("evalstream_runs_total", "Runs by outcome (accepted, rejected, completed)", ["outcome"])
TOKENS = Counter("evalstream_tokens_total", "Tokens processed", ["direction"])
BATCH_SIZE = Histogram(
    "evalstream_batch_size", "Items per engine batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
)
PADDING_RATIO = Histogram(
    "evalstream_batch_padding_ratio",
    "Share of padded positions per batch",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75),
)
ENGINE_BUSY = Gauge("evalstream_engine_busy_ratio", "Share of the last interval the engine was generating")
GPU_UTILIZATION = Gauge("evalstream_gpu_utilization_ratio", "GPU utilisation 0..1 (NVML)", ["device"])
GPU_MEMORY_USED = Gauge("evalstream_gpu_memory_used_bytes", "GPU memory used (NVML)", ["device"])
GPU_MEMORY_FREE = Gauge("evalstream_gpu_memory_free_bytes", "GPU memory free (NVML)", ["device"])
GPU_TEMPERATURE = Gauge("evalstream_gpu_temperature_celsius", "GPU temperature (NVML)", ["device"])
GPU_POWER = Gauge("evalstream_gpu_power_watts", "GPU power draw (NVML)", ["device"])
CPU_UTILIZATION = Gauge(
    "evalstream_cpu_utilization_ratio", "Host CPU utilisation 0..1 (fallback without GPU)"
)
RUN_PROGRESS = Gauge("evalstream_run_progress_ratio", "Share of a run's items with a result", ["run_id"])
CONSUMER_LAG = Gauge("evalstream_consumer_lag", "Committed vs end offset", ["group", "topic", "partition"])
