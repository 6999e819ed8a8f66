"""The Grafana boards (ops/grafana/boards.py): the committed JSON is what the code generates,
every query is valid PromQL and reads metrics that exist, the boards fit the provisioning.
(tests/e2e/test_observability.py checks that every query returns data from the stack.)"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import evalstream.common.metrics  # noqa: F401  (registers the metrics)

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "ops/grafana"
RULES = ROOT / "ops/prometheus/rules"


def load_boards() -> ModuleType:
    spec = importlib.util.spec_from_file_location("evalstream_grafana_boards", GRAFANA / "boards.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


boards = load_boards()


def committed() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").glob("*.json"))}


def test_committed_json_equals_a_fresh_generation() -> None:
    assert set(committed()) == set(boards.BOARDS), "a board file without code, or code without its file"
    for name, make in boards.BOARDS.items():
        fresh = boards.render(make)
        assert (GRAFANA / "dashboards" / name).read_text() == fresh, (
            f"{name} is stale: run .venv/bin/python ops/grafana/boards.py"
        )


def test_the_four_boards_are_there_with_unique_uids_titles_and_panel_ids() -> None:
    found = committed()
    assert {b["uid"] for b in found.values()} == {
        "evalstream-overview",
        "evalstream-workers",
        "evalstream-kafka",
        "evalstream-runs",
    }
    for name, board in found.items():
        titles = [p["title"] for p in board["panels"] if p["type"] != "row"]
        assert len(titles) == len(set(titles)), name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and None not in ids, name
        assert board["editable"] is False and "evalstream" in board["tags"]
        for panel in board["panels"]:
            assert panel.get("gridPos", {}).get("w", 0) > 0, (name, panel["title"])


def test_every_query_uses_the_provisioned_datasource() -> None:
    provisioning = GRAFANA / "provisioning/datasources/prometheus.yml"
    (datasource,) = yaml.safe_load(provisioning.read_text())["datasources"]
    for name, board in committed().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                assert target["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}, (
                    name,
                    panel["title"],
                )
        for variable in board.get("templating", {}).get("list", []):
            assert variable["datasource"]["uid"] == datasource["uid"]


def all_queries() -> list[tuple[str, str, str]]:
    out = []
    for name, board in committed().items():
        for title, exprs in boards.panel_queries(board):
            out += [(name, title, expr) for expr in exprs]
    return out


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule: the offline parser at hand)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus; `make up` installs it)")
    queries = all_queries()
    assert len(queries) >= 30
    rules = [
        {"record": f"board:query_{i}", "expr": boards.substitute(expr, {"run_id": ".+", "group": ".+"})}
        for i, (_, _, expr) in enumerate(queries)
    ]
    path = tmp_path / "boards.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "boards", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # and the check is not blind: a broken query fails it
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "b", "rules": [{"record": "b:x", "expr": "sum(rate(x[5m])"}]}]})
    )
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True).returncode != 0


def exported_kinds() -> dict[str, str]:
    """Every sample name the registered metrics export, with its metric's type."""
    kinds: dict[str, str] = {}
    for collector in list(REGISTRY._collector_to_names):
        for metric in collector.describe() if hasattr(collector, "describe") else []:
            for suffix in ("", "_total", "_bucket", "_sum", "_count"):
                kinds.setdefault(metric.name + suffix, metric.type)
    return kinds


def test_queries_read_only_metrics_that_exist() -> None:
    exported = exported_kinds()
    recorded = set(re.findall(r"record:\s*(\S+)", "".join(p.read_text() for p in RULES.glob("*.yml"))))
    # FastStream's Prometheus middleware and the client's process collector export these.
    foreign = re.compile(r"^(faststream_received_|process_resident_memory_bytes$)")
    unknown = set()
    for _, _, expr in all_queries():
        for name in re.findall(r"\b(evalstream[_:][a-z0-9_:]+|faststream_[a-z_]+|process_[a-z_]+)\b", expr):
            if name not in exported and name not in recorded and not foreign.match(name):
                unknown.add(name)
    assert not unknown, f"boards query metrics nobody exports: {sorted(unknown)}"


def test_rates_are_taken_of_counters_never_of_gauges() -> None:
    """rate() and increase() read a fall as a counter reset: over a gauge that can fall (a
    run's failed items, when a redrive turns one into a success) they draw a spike."""
    kinds = exported_kinds()
    rules = yaml.safe_load((RULES / "evalstream.yml").read_text())["groups"]
    exprs = [expr for _, _, expr in all_queries()]
    exprs += [str(rule["expr"]) for group in rules for rule in group["rules"]]
    taken = re.compile(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
    over_gauges = {name for expr in exprs for name in taken.findall(expr) if kinds.get(name) == "gauge"}
    assert not over_gauges, f"rate()/increase() over gauges: {sorted(over_gauges)}"
    assert kinds["evalstream_run_items_total"] == "gauge"  # the check knows its gauges


def test_substitute_replaces_variables_as_grafana_does() -> None:
    expr = 'rate(x{run_id=~"$run_id", g="${group}"}[$__rate_interval]) + increase(y[$__range])'
    assert (
        boards.substitute(expr, {"run_id": "r1", "group": "g"}, rate_interval="1m", range_="2h")
        == 'rate(x{run_id=~"r1", g="g"}[1m]) + increase(y[2h])'
    )
