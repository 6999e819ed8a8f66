"""The alert rules (ops/prometheus/rules) pass promtool's checks and unit tests, every alert
has a case that fires and one that must not, the tests notice a broken threshold, and every
metric the rules read is one the services export."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import evalstream.common.metrics  # noqa: F401  (registers the metrics)

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops/prometheus/rules"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*.yml"))
# Exported by other components, not by evalstream's registry: FastStream's middleware, the
# Prometheus client's process collector, Prometheus itself.
FOREIGN = re.compile(r"^(faststream_|process_|python_|up$|scrape_)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed (Debian package prometheus; `make up` installs it)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, cwd=RULES)


def alerts() -> dict[str, str]:
    out = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule["expr"]
    return out


def test_rule_files_pass_promtool_check() -> None:
    assert RULE_FILES and TEST_FILES
    result = promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_issue_s_alerts_exist_each_with_a_firing_and_a_quiet_case() -> None:
    assert set(alerts()) == {
        "EvalstreamHighFailureRate",
        "EvalstreamHighP99Latency",
        "EvalstreamGpuUnderutilised",
        "EvalstreamConsumerLagGrowing",
        "EvalstreamDeadLetters",
        "EvalstreamWorkerGroupWithoutHeartbeats",
    }
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert fires == set(alerts()), f"no firing case for {set(alerts()) - fires}"
    assert quiet == set(alerts()), f"no must-not-fire case for {set(alerts()) - quiet}"


@pytest.mark.parametrize(
    ("original", "broken"),
    [
        ("evalstream:items_failed:ratio_rate5m > 0.03", "evalstream:items_failed:ratio_rate5m > 0.3"),
        ('{stage="engine"} > 0.8', '{stage="engine"} > 8'),
        (") < 0.7", ") < 0.2"),
        (
            "max_over_time(evalstream_worker_last_heartbeat_timestamp_seconds[1h])) > 60",
            "max_over_time(evalstream_worker_last_heartbeat_timestamp_seconds[1h])) > 6000",
        ),
    ],
)
def test_the_rule_tests_catch_a_wrong_threshold(tmp_path: Path, original: str, broken: str) -> None:
    """The unit tests are not vacuous: the same tests against a mis-set rule fail."""
    (tmp_path / "tests").mkdir()
    changed = False
    for path in RULE_FILES:
        text = path.read_text()
        if original in text:
            text = text.replace(original, broken)
            changed = True
        (tmp_path / path.name).write_text(text)
    assert changed
    for path in TEST_FILES:
        shutil.copy(path, tmp_path / "tests" / path.name)
    result = promtool("test", "rules", *(str(tmp_path / "tests" / p.name) for p in TEST_FILES))
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_rules_read_only_metrics_the_services_export() -> None:
    exported = set()
    for collector in list(REGISTRY._collector_to_names):
        for metric in collector.describe() if hasattr(collector, "describe") else []:
            exported.add(metric.name)
            if metric.type == "counter":
                exported.add(metric.name + "_total")
            if metric.type == "histogram":
                exported |= {metric.name + s for s in ("_bucket", "_sum", "_count")}
    used = set()
    for path in RULE_FILES:
        used |= set(re.findall(r"\b(evalstream_[a-z0-9_]+)", path.read_text()))
    unknown = {m for m in used if m not in exported and not FOREIGN.match(m)}
    assert not unknown, f"rules read metrics nobody exports: {sorted(unknown)}"
