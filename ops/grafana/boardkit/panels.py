"""Panel builders of the boards (grafana-foundation-sdk): Prometheus queries on the provisioned
datasource, time series, stats, heatmaps, state timelines, and a board's common settings."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as heatmap_panel
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import statetimeline as state_panel
from grafana_foundation_sdk.builders import timeseries as ts_panel
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

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
