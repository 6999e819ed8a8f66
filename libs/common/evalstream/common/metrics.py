"""Prometheus metric names shared across services (one place, so boards and alerts fit).

Latency buckets resolve 10 ms to 60 s. What each item status counts, and where:

* worker: `succeeded` (answered and graded), `cache_hit` (of those, served from the answer
  cache), `retried` (a failed attempt sent to eval.retry), `dead_lettered` (the last attempt
  failed: sent to eval.dlq);
* aggregator: `succeeded` and `failed`, the final outcomes it records (the failure rate
  alert and boards use these two).

Stages of STAGE_LATENCY: `queue_wait` (work record's broker timestamp -> worker picks it up,
per shard), `engine` (one engine call, per batch), `grading` (per worker round),
`worker_batch` (a whole worker round), `end_to_end` (run created -> result recorded, per
item, in the aggregator). Series labelled with a run_id are removed some minutes after the
run completes (forget_run), so their number stays bounded.
"""

from __future__ import annotations

import contextlib

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
# The aggregator's results sink, per window (aggregator/sink.py): waiting for the write lock,
# the database write under it, waiting for the mirror lock, then, under that, reading the
# Delta table's transaction versions, the Parquet segments, the Delta commit and the
# completion checks.
SINK_STAGE = Histogram(
    "evalstream_sink_stage_seconds",
    "Time per results-sink window stage (staging, lock_wait, database, mirror_wait, delta_versions, parquet, delta_commit, completion)",
    ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
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

# --- added for operations (issue 7); names above are kept as they are.
ENGINE_BUSY_SECONDS = Counter(
    "evalstream_engine_busy_seconds_total",
    "Seconds the engine spent generating; rate() is the busy ratio over any window",
)
WORKER_HEARTBEAT = Gauge(
    "evalstream_worker_last_heartbeat_timestamp_seconds",
    "Unix time of the last heartbeat a worker published to eval.heartbeats",
    ["worker_group", "worker_id"],
)
HOST_MEMORY_AVAILABLE = Gauge(
    "evalstream_host_memory_available_bytes", "Host MemAvailable (fallback without GPU memory gauges)"
)
# A gauge, not a counter: it is the run's rows by outcome, and a failure that a redrive
# turns into a success moves from `failed` to `succeeded` (the name is kept for the boards,
# alerts and the fault checker that read it).
RUN_ITEMS = Gauge(
    "evalstream_run_items_total",
    "Results recorded per run, by current outcome (succeeded, failed)",
    ["run_id", "status"],
)
RUN_SCORE = Counter(
    "evalstream_run_score_total", "Sum of item scores recorded per run (a failure scores 0)", ["run_id"]
)
RUN_ACCURACY = Gauge(
    "evalstream_run_accuracy_ratio", "Final accuracy of a completed run (from the database)", ["run_id"]
)

_RUN_SERIES: tuple[tuple[Counter | Gauge, tuple[str, ...]], ...] = (
    (RUN_PROGRESS, ()),
    (RUN_ACCURACY, ()),
    (RUN_SCORE, ()),
    (RUN_ITEMS, ("succeeded",)),
    (RUN_ITEMS, ("failed",)),
)


# The series each service reports, made at 0 when it starts: a series that a scrape first
# sees above 0 hides that first count from rate() and increase() (boards, alerts).
_SERVICE_SERIES: dict[str, tuple[tuple[Counter | Histogram, tuple[str, ...]], ...]] = {
    "producer": tuple((RUNS, (outcome,)) for outcome in ("running", "rejected")),
    "worker": (
        *((STAGE_LATENCY, (stage,)) for stage in ("queue_wait", "engine", "grading", "worker_batch")),
        *((ITEMS, ("worker", s)) for s in ("succeeded", "cache_hit", "retried", "dead_lettered")),
        *((SHARDS, ("worker", outcome)) for outcome in ("done", "dead_lettered")),
    ),
    "aggregator": (
        (STAGE_LATENCY, ("end_to_end",)),
        *((ITEMS, ("aggregator", s)) for s in ("succeeded", "failed")),
        (RUNS, ("completed",)),
    ),
}


def start_series(service: str | None) -> None:
    """Makes `service`'s series at 0 (a process calls this once, as it starts); a worker's
    name carries its group ("worker-<group>")."""
    for metric, labels in _SERVICE_SERIES.get((service or "").partition("-")[0], ()):
        metric.labels(*labels)


def forget_run(run_id: str) -> None:
    """Drops every series labelled with `run_id` (after the run completed and boards had
    time to show it): run ids are unbounded, the registry must not be."""
    for metric, rest in _RUN_SERIES:
        with contextlib.suppress(KeyError):  # never set, or already removed
            metric.remove(run_id, *rest)


# --- added for model APIs and the answer cache (issue 4).
ENGINE_REQUESTS = Counter(
    "evalstream_engine_requests_total",
    "Requests handed to an engine (answer-cache misses): zero for a run served from the cache",
    ["model"],
)
API_REQUESTS = Counter(
    "evalstream_api_requests_total",
    "HTTP requests to model APIs by outcome (ok, rate_limited, server_error, timeout, connection_error, malformed, client_error)",
    ["model", "outcome"],
)
API_RETRIES = Counter(
    "evalstream_api_retries_total", "API requests retried by the engine, by reason", ["model", "reason"]
)
API_CONCURRENCY = Gauge(
    "evalstream_api_concurrency_limit",
    "Adaptive concurrency limit of an API engine (halves on 429)",
    ["model"],
)

# --- added for the router (issue 5): routing decisions, back-pressure, health, SLA fallback.
ROUTER_ROUTED = Counter(
    "evalstream_router_routed_shards_total",
    "Shards the router sent to a worker group, by policy and served model (rerouted: moved from a dead group)",
    ["policy", "worker_group", "model", "reason"],
)
ROUTER_BACKPRESSURE = Gauge(
    "evalstream_router_backpressure_waiting",
    "Router consumers holding a shard because every eligible group is saturated",
)
ROUTER_LAG_READS = Counter(
    "evalstream_router_lag_reads_total",
    "Consumer-lag reads of a worker group by the router",
    ["worker_group"],
)
ROUTER_GROUP_OUTSTANDING = Gauge(
    "evalstream_router_group_outstanding_shards",
    "Shards routed to a group and not yet committed by it (measured lag + routed since)",
    ["worker_group"],
)
ROUTER_GROUP_HEALTHY = Gauge(
    "evalstream_router_group_live_members", "Members of a group with a fresh heartbeat", ["worker_group"]
)
ROUTER_POLICY_WEIGHT = Gauge(
    "evalstream_router_policy_weight", "Current (adapted) weight of a term of the weighted score", ["term"]
)
ROUTER_SLA_VIOLATION = Gauge(
    "evalstream_router_sla_violation_ratio",
    "SLA violation rate over 60 s (0.7 latency + 0.3 error violations) of the groups serving a model",
    ["model"],
)
ROUTER_SLA_TIER = Gauge(
    "evalstream_router_sla_fallback_tier",
    "SLA fallback tier in force for a model's opted-in runs (0: the model itself; k: k steps down ROUTER_FALLBACK)",
    ["model"],
)
