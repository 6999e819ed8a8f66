"""The board of one run: its progress, results and cache."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import (
    VariableOption,
    VariableRefresh,
)

from boardkit.panels import DATASOURCE, RATE, board, heatmap, stat, state_timeline, timeseries


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
