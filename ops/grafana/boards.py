"""evalstream's Grafana boards as code (grafana-foundation-sdk). Generates the JSON that
docker-compose's Grafana provisions from ops/grafana/dashboards:

    .venv/bin/python ops/grafana/boards.py           # write ops/grafana/dashboards/*.json
    .venv/bin/python ops/grafana/boards.py --check   # exit 1 if the committed JSON is stale

Edit the boards here, never in Grafana's UI (provisioning forbids saving them there).
tests/unit/test_boards.py checks that the committed JSON equals a fresh generation, and
tests/e2e/test_observability.py that every panel's query returns data from the real
Prometheus after a run. Metric names: libs/common/evalstream/common/metrics.py; recording
rules (evalstream:*): ops/prometheus/rules/evalstream.yml.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as heatmap_panel
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import statetimeline as state_panel
from grafana_foundation_sdk.builders import timeseries as ts_panel
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    LineInterpolation,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).resolve().parent / "dashboards"
# ops/grafana/provisioning/datasources/prometheus.yml gives the datasource this uid.
DATASOURCE = DataSourceRef(type_val="prometheus", uid="prometheus")
TAGS = ["evalstream", "generated"]
RATE = "$__rate_interval"


def query(expr: str, legend: str = "", ref: str = "A") -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(DATASOURCE)


def timeseries(
    title: str,
    *queries: tuple[str, str],
    unit: str = "short",
    description: str = "",
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    min_zero: bool = True,
) -> ts_panel.Panel:
    panel = (
        ts_panel.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .line_width(2)
        .fill_opacity(10)
        .legend(
            VizLegendOptions()
            .show_legend(True)
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
        )
    )
    if min_zero:
        panel = panel.min(0)
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL))
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, ref=chr(ord("A") + i)))
    return panel


def stat(
    title: str, expr: str, *, unit: str = "short", description: str = "", width: int = 4
) -> stat_panel.Panel:
    return (
        stat_panel.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .with_target(query(expr))
    )


def heatmap(title: str, expr: str, *, description: str = "", width: int = 12) -> heatmap_panel.Panel:
    """Buckets of a Prometheus histogram over time (one cell per bucket and step): where the
    latency mass sits and how it moves, which two percentiles cannot show."""
    return (
        heatmap_panel.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .calculate(False)  # the buckets are Prometheus's own
        .with_target(query(expr, "{{le}}").format(PromQueryFormat.HEATMAP))
    )


def state_timeline(
    title: str, expr: str, legend: str, states: dict[int, tuple[str, str]], *, description: str = ""
) -> state_panel.Panel:
    """One lane per series, coloured by its state (value -> (text, colour)) over time."""
    mapping = ValueMap({str(v): ValueMappingResult(text=t, color=c, index=v) for v, (t, c) in states.items()})
    return (
        state_panel.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .decimals(0)
        .mappings([mapping])
        .legend(
            VizLegendOptions()
            .show_legend(True)
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
        )
        .with_target(query(expr, legend))
    )


def board(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
        .readonly()
    )


# --------------------------------------------------------------------------- boards


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


def runs() -> db.Dashboard:
    selected = 'run_id=~"$run_id"'
    return (
        board(
            "evalstream-runs",
            "evalstream / Runs: progress and accuracy",
            "Per-run progress, results and accuracy. Run series disappear 15 minutes after the run completes;"
            " the run's HTML report (aggregator /runs/<run_id>/report.html) keeps everything.",
        )
        .with_variable(
            db.QueryVariable("run_id")
            .label("run")
            .datasource(DATASOURCE)
            .query("label_values(evalstream_run_progress_ratio, run_id)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".+")
            .current(VariableOption(selected=True, text="All", value="$__all"))
        )
        .with_panel(
            timeseries(
                "Progress",
                (f"max by (run_id) (evalstream_run_progress_ratio{{{selected}}})", "{{run_id}}"),
                unit="percentunit",
                description="Share of the run's items with a result.",
            )
        )
        .with_panel(
            timeseries(
                "Accuracy so far",
                (
                    f"sum by (run_id) (evalstream_run_score_total{{{selected}}})"
                    f" / sum by (run_id) (evalstream_run_items_total{{{selected}}})",
                    "{{run_id}}",
                ),
                unit="percentunit",
                description="Mean score of the results recorded so far (a failure scores 0).",
            )
        )
        .with_panel(
            stat(
                "Final accuracy",
                f"max by (run_id) (evalstream_run_accuracy_ratio{{{selected}}})",
                unit="percentunit",
                description="From the database when the run completed.",
                width=8,
            )
        )
        .with_panel(
            stat(
                "Failed items",
                f'sum by (run_id) (evalstream_run_items_total{{{selected}, status="failed"}})',
                width=8,
            )
        )
        .with_panel(
            stat(
                "Results recorded",
                f"sum by (run_id) (evalstream_run_items_total{{{selected}}})",
                width=8,
            )
        )
        .with_panel(
            timeseries(
                "Results / s",
                (
                    f"sum by (run_id, status) (deriv(evalstream_run_items_total{{{selected}}}[{RATE}]))",
                    "{{run_id}} {{status}}",
                ),
                unit="reqps",
                # a gauge (a redriven failure moves to succeeded): its slope, not rate(), which
                # would read the fall of `failed` as a counter reset
                description="Items recorded per second by outcome; a redrive shows as failed < 0.",
            )
        )
        .with_panel(
            timeseries(
                "End-to-end latency (p50, p95)",
                (
                    f'histogram_quantile(0.5, sum by (le) (rate(evalstream_stage_latency_seconds_bucket{{stage="end_to_end"}}[{RATE}])))',
                    "p50",
                ),
                (
                    f'histogram_quantile(0.95, sum by (le) (rate(evalstream_stage_latency_seconds_bucket{{stage="end_to_end"}}[{RATE}])))',
                    "p95",
                ),
                unit="s",
                description="Run created -> an item's result recorded (all runs).",
            )
        )
        .with_panel(
            heatmap(
                "Latency heatmap (end to end)",
                f'sum by (le) (increase(evalstream_stage_latency_seconds_bucket{{stage="end_to_end"}}[{RATE}]))',
                description="Items per latency bucket and time step, run created -> result recorded (all runs).",
            )
        )
        .with_panel(
            heatmap(
                "Latency heatmap (engine)",
                f'sum by (le) (increase(evalstream_stage_latency_seconds_bucket{{stage="engine"}}[{RATE}]))',
                description="Engine time per item, by latency bucket and time step (all workers).",
            )
        )
        .with_panel(
            timeseries(
                "Router decisions / s",
                (
                    f"sum by (worker_group, model, reason) (rate(evalstream_router_routed_shards_total[{RATE}]))",
                    "{{worker_group}} {{model}} {{reason}}",
                ),
                unit="reqps",
                description="Shards the router sent to each worker group, by the model that serves them"
                " and why (a model other than the run's: an SLA fallback; rerouted: moved from a dead group).",
            )
        )
        .with_panel(
            timeseries(
                "Router score weights",
                ("max by (term) (evalstream_router_policy_weight)", "{{term}}"),
                description="Current weight of each term of the weighted routing score (lag, latency, GPU,"
                " memory), as adapted from the fleet's spread.",
            )
        )
        .with_panel(
            timeseries(
                "Router SLA violation rate",
                ("max by (model) (evalstream_router_sla_violation_ratio)", "{{model}}"),
                unit="percentunit",
                description="Per model, over the last 60 s of its groups' heartbeats: 0.7 x the share over"
                " ROUTER_SLA_P95_MS + 0.3 x the share over ROUTER_SLA_MAX_ERROR_RATE. Computed when a shard"
                " of a run that opted into SLA fallback (evalctl submit --sla-fallback) is routed.",
            ).max(1)
        )
        .with_panel(
            state_timeline(
                "SLA fallback tier in force",
                "max by (model) (evalstream_router_sla_fallback_tier)",
                "{{model}}",
                {
                    0: ("requested model", "green"),
                    1: ("tier 1: one step lighter", "orange"),
                    2: ("tier 2: two steps lighter", "red"),
                    3: ("tier 3: three steps lighter", "dark-red"),
                },
                description="How many of ROUTER_SLA_TIERS the model's violation rate reaches: opted-in runs"
                " of the model are served that many steps down its ROUTER_FALLBACK chain.",
            )
        )
        .with_panel(
            timeseries(
                "Answer-cache hit ratio",
                (
                    f'sum(rate(evalstream_items_total{{service="worker", status="cache_hit"}}[{RATE}]))'
                    f' / sum(rate(evalstream_items_total{{service="worker", status="succeeded"}}[{RATE}]))',
                    "hit ratio",
                ),
                unit="percentunit",
                # both series exist from a worker's start (metrics.start_series); the engines'
                # request counters appear only with each model's first batch
                description="Items answered from the cache / items answered and graded.",
            )
        )
    )


BOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "evalstream-overview.json": overview,
    "evalstream-workers.json": workers,
    "evalstream-kafka.json": kafka,
    "evalstream-runs.json": runs,
}


def render(make: Callable[[], db.Dashboard]) -> str:
    built = make().build()
    for i, panel in enumerate(built.panels or [], start=1):
        panel.id_val = i  # stable ids: links to a panel (viewPanel=<id>) survive regeneration
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def panel_queries(board_json: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(panel title, its queries) of every panel of a generated board."""
    return [
        (panel["title"], [t["expr"] for t in panel.get("targets", [])])
        for panel in board_json["panels"]
        if panel.get("targets")
    ]


def substitute(
    expr: str, variables: dict[str, str], *, rate_interval: str = "30s", range_: str = "1h"
) -> str:
    """An expression as Grafana would send it: template variables and the built-in
    $__rate_interval / $__range / $__interval replaced."""
    out = (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__range", range_)
        .replace("$__interval", "15s")
    )
    for name in sorted(variables, key=len, reverse=True):  # $run_id before a $run
        out = out.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed board differs from the code")
    args = ap.parse_args()
    stale = []
    for name, make in BOARDS.items():
        path, text = OUT / name, render(make)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run: .venv/bin/python ops/grafana/boards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
