"""The boards of the services: the overview, the workers and Kafka."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.common import (
    LineInterpolation,
)
from grafana_foundation_sdk.models.dashboard import (
    VariableOption,
    VariableRefresh,
)

from boardkit.panels import DATASOURCE, RATE, board, stat, timeseries


def overview() -> db.Dashboard:
    return (
        board(
            "evalstream-overview",
            "evalstream / Pipeline overview",
            "Items through the pipeline, failures, latency per stage, dead letters.",
        )
        .with_row(db.Row("Now"))
        .with_panel(
            stat(
                "Results recorded / s",
                f'sum(rate(evalstream_items_total{{service="aggregator"}}[{RATE}]))',
                unit="reqps",
                description="Final item outcomes the aggregator wrote (succeeded + failed).",
            )
        )
        .with_panel(
            stat(
                "Failure rate (5 m)",
                "evalstream:items_failed:ratio_rate5m",
                unit="percentunit",
                description="Alert EvalstreamHighFailureRate above 3 %.",
            )
        )
        .with_panel(
            stat(
                "Engine P99 (5 m)",
                'evalstream:stage_latency_seconds:p99_5m{stage="engine"}',
                unit="s",
                description="Alert EvalstreamHighP99Latency above 800 ms.",
            )
        )
        .with_panel(
            stat(
                "Work queued (shards)",
                "sum(evalstream:work_queued:sum)",
                description="Consumer lag of every worker group's work topic.",
            )
        )
        .with_panel(
            stat(
                "Runs completed (range)",
                'sum(increase(evalstream_runs_total{outcome="completed"}[$__range]))',
            )
        )
        .with_panel(stat("Dead letters (range)", "sum(increase(evalstream_dead_letters_total[$__range]))"))
        .with_row(db.Row("Throughput and outcomes"))
        .with_panel(
            timeseries(
                "Items / s by outcome",
                (
                    f"sum by (service, status) (rate(evalstream_items_total[{RATE}]))",
                    "{{service}} {{status}}",
                ),
                unit="reqps",
                description="Aggregator: final outcomes. Worker: attempts (retried, dead_lettered) and cache hits.",
            )
        )
        .with_panel(
            timeseries(
                "Tokens / s",
                (f"sum by (direction) (rate(evalstream_tokens_total[{RATE}]))", "{{direction}}"),
                description="Prompt (in) and generated (out) tokens of engine calls (cache hits excluded).",
            )
        )
        .with_panel(
            timeseries(
                "Latency per stage (p50, p99)",
                (
                    f"histogram_quantile(0.5, sum by (stage, le) (rate(evalstream_stage_latency_seconds_bucket[{RATE}])))",
                    "p50 {{stage}}",
                ),
                (
                    f"histogram_quantile(0.99, sum by (stage, le) (rate(evalstream_stage_latency_seconds_bucket[{RATE}])))",
                    "p99 {{stage}}",
                ),
                unit="s",
                description="queue_wait, engine, grading, worker_batch, end_to_end (run created -> result recorded).",
            )
        )
        .with_panel(
            timeseries(
                "Dead letters / s",
                (
                    f"sum by (topic, reason) (rate(evalstream_dead_letters_total[{RATE}]))",
                    "{{topic}} {{reason}}",
                ),
                unit="reqps",
                description="Messages sent to eval.dlq, by the topic they came from and why.",
            )
        )
        .with_panel(
            timeseries(
                "Kafka messages handled / s",
                (
                    f"sum by (app_name, handler) (rate(faststream_received_processed_messages_total[{RATE}]))",
                    "{{app_name}} {{handler}}",
                ),
                unit="reqps",
                description="FastStream's Prometheus middleware, per service and subscriber.",
            )
        )
        .with_panel(
            timeseries(
                "Runs / s by outcome",
                (f"sum by (outcome) (rate(evalstream_runs_total[{RATE}]))", "{{outcome}}"),
                unit="reqps",
                description="accepted / rejected by the producer, completed by the aggregator.",
            )
        )
    )


def workers() -> db.Dashboard:
    gpu_only = "GPU only (NVML, in the DCGM exporter's spirit): empty on CPU-only workers."
    return (
        board(
            "evalstream-workers",
            "evalstream / Workers and GPUs",
            "Heartbeats, device utilisation (GPU, CPU fallback), engine batching and busy time.",
        )
        .with_row(db.Row("Fleet"))
        .with_panel(
            timeseries(
                "Heartbeat age per worker",
                (
                    "time() - evalstream_worker_last_heartbeat_timestamp_seconds",
                    "{{worker_group}} / {{worker_id}}",
                ),
                unit="s",
                description="Alert EvalstreamWorkerGroupWithoutHeartbeats when a whole group exceeds 60 s.",
            )
        )
        .with_panel(
            timeseries(
                "Device utilisation",
                ("evalstream_gpu_utilization_ratio", "GPU {{instance}} {{device}}"),
                ('evalstream_cpu_utilization_ratio{service="worker"}', "CPU {{instance}} (fallback)"),
                unit="percentunit",
                description="GPU utilisation from NVML; host CPU utilisation where a worker has no GPU.",
            )
        )
        .with_panel(
            timeseries(
                "Memory",
                ("evalstream_gpu_memory_used_bytes", "GPU used {{instance}}"),
                ("evalstream_gpu_memory_free_bytes", "GPU free {{instance}}"),
                ('process_resident_memory_bytes{service="worker"}', "process RSS {{instance}} (fallback)"),
                (
                    'evalstream_host_memory_available_bytes{service="worker"}',
                    "host available {{instance}} (fallback)",
                ),
                unit="bytes",
            )
        )
        .with_panel(
            timeseries(
                "GPU temperature",
                ("evalstream_gpu_temperature_celsius", "{{instance}} {{device}}"),
                unit="celsius",
                description=gpu_only,
                width=6,
            )
        )
        .with_panel(
            timeseries(
                "GPU power",
                ("evalstream_gpu_power_watts", "{{instance}} {{device}}"),
                unit="watt",
                description=gpu_only,
                width=6,
            )
        )
        .with_row(db.Row("Engine"))
        .with_panel(
            timeseries(
                "Engine busy ratio",
                (f'rate(evalstream_engine_busy_seconds_total{{service="worker"}}[{RATE}])', "{{instance}}"),
                unit="percentunit",
                description="Share of time the engine spent generating (low with work queued: the GPU is starved).",
            )
        )
        .with_panel(
            timeseries(
                "Engine and grading latency (p95)",
                (
                    f'histogram_quantile(0.95, sum by (stage, le) (rate(evalstream_stage_latency_seconds_bucket{{service="worker"}}[{RATE}])))',
                    "{{stage}}",
                ),
                unit="s",
            )
        )
        .with_panel(
            timeseries(
                "Batch size (p50, p95)",
                (f"histogram_quantile(0.5, sum by (le) (rate(evalstream_batch_size_bucket[{RATE}])))", "p50"),
                (
                    f"histogram_quantile(0.95, sum by (le) (rate(evalstream_batch_size_bucket[{RATE}])))",
                    "p95",
                ),
                description="Items per engine call (token budget and max wait decide it).",
            )
        )
        .with_panel(
            timeseries(
                "Padding ratio (p50, p95)",
                (
                    f"histogram_quantile(0.5, sum by (le) (rate(evalstream_batch_padding_ratio_bucket[{RATE}])))",
                    "p50",
                ),
                (
                    f"histogram_quantile(0.95, sum by (le) (rate(evalstream_batch_padding_ratio_bucket[{RATE}])))",
                    "p95",
                ),
                unit="percentunit",
                description="Share of padded positions in a batch (length-sorted batching keeps it low).",
            )
        )
        .with_panel(
            timeseries(
                "Worker attempts / s",
                (
                    f'sum by (status) (rate(evalstream_items_total{{service="worker"}}[{RATE}]))',
                    "{{status}}",
                ),
                unit="reqps",
                stacked=False,
                description="succeeded, cache_hit, retried, dead_lettered.",
            )
        )
        .with_panel(
            timeseries(
                "Tokens / s per worker",
                (
                    f'sum by (instance, direction) (rate(evalstream_tokens_total{{service="worker"}}[{RATE}]))',
                    "{{instance}} {{direction}}",
                ),
            )
        )
        .with_row(db.Row("Model APIs (openai: engine)"))
        .with_panel(
            timeseries(
                "API requests / s by outcome (429s: rate_limited)",
                (
                    f"sum by (model, outcome) (rate(evalstream_api_requests_total[{RATE}]))",
                    "{{model}} {{outcome}}",
                ),
                (
                    f"sum by (model, reason) (rate(evalstream_api_retries_total[{RATE}]))",
                    "{{model}} retried ({{reason}})",
                ),
                unit="reqps",
                description="HTTP requests to model APIs by outcome: ok, rate_limited (HTTP 429), server_error,"
                " timeout, connection_error, malformed, client_error; and the requests the engine retried,"
                " by reason. The model label is the engine's revision (model@endpoint).",
            )
        )
        .with_panel(
            timeseries(
                "Adaptive concurrency limit",
                ("max by (model) (evalstream_api_concurrency_limit)", "{{model}}"),
                description="Requests an API engine lets in flight at once: halved on each 429, grown back"
                " one at a time while requests succeed, never above the SPEC's concurrency.",
            )
            .line_interpolation(LineInterpolation.STEP_AFTER)
            .decimals(0)
        )
    )


def kafka() -> db.Dashboard:
    return (
        board(
            "evalstream-kafka",
            "evalstream / Kafka lag",
            "Consumer lag per group and partition (exported by the router) and message rates.",
        )
        .with_variable(
            db.QueryVariable("group")
            .label("consumer group")
            .datasource(DATASOURCE)
            .query("label_values(evalstream_consumer_lag, group)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all"))
        )
        .with_panel(
            timeseries(
                "Lag per consumer group",
                (
                    'sum by (group, topic) (evalstream_consumer_lag{group=~"$group"})',
                    "{{group}} on {{topic}}",
                ),
                description="Alert EvalstreamConsumerLagGrowing when it grows for 10 minutes.",
            )
        )
        .with_panel(
            timeseries(
                "Lag per partition",
                ('evalstream_consumer_lag{group=~"$group"}', "{{topic}}[{{partition}}]"),
                stacked=True,
            )
        )
        .with_panel(
            timeseries(
                "Work queued per worker group",
                ("evalstream:work_queued:sum", "{{worker_group}}"),
                description="Shards waiting in eval.work.<group>.",
            )
        )
        .with_panel(
            timeseries(
                "Lag trend (per minute)",
                (
                    'deriv(sum by (group) (evalstream_consumer_lag{group=~"$group"})[5m:30s]) * 60',
                    "{{group}}",
                ),
                min_zero=False,
                description="Positive: consumers fall behind.",
            )
        )
        .with_panel(
            timeseries(
                "Messages received / s",
                (
                    f"sum by (app_name, handler) (rate(faststream_received_messages_total[{RATE}]))",
                    "{{app_name}} {{handler}}",
                ),
                unit="reqps",
            )
        )
        .with_panel(
            timeseries(
                "Handler duration (p95)",
                (
                    f"histogram_quantile(0.95, sum by (app_name, handler, le) (rate(faststream_received_processed_messages_duration_seconds_bucket[{RATE}])))",
                    "{{app_name}} {{handler}}",
                ),
                unit="s",
            )
        )
    )
