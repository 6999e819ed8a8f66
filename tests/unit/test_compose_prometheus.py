"""The Prometheus configs and Grafana's provisioning agree with docker-compose.yml and the local
stack (ops/local/stack.py): `promtool check config` on both Prometheus configs, the jobs each
scrapes, and the datasource and boards folder Grafana is given."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalstream.common.settings import SERVICE_PORTS
from tests.unit.compose_files import COMPOSE, PROMETHEUS, ROOT, SERVICES, STACK_OFFSET, published_ports, stack

# --------------------------------------------------------------------------- Prometheus and Grafana


def _promtool(config: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus; `make up` installs it)")
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    # Rule files are read from the repository's folder, which compose mounts at /etc/prometheus/rules.
    mounts = dict(str(v).split(":")[:2][::-1] for v in COMPOSE["services"]["prometheus"]["volumes"])
    assert mounts["/etc/prometheus/prometheus.yml"] == "./ops/prometheus/prometheus.compose.yml"
    assert mounts["/etc/prometheus/rules"] == "./ops/prometheus/rules"
    text = (PROMETHEUS / "prometheus.compose.yml").read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/rules/", f"{PROMETHEUS / 'rules'}/"))
    _promtool(config)


def test_local_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    text = (PROMETHEUS / "prometheus.local.yml").read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("__STACK__", str(tmp_path)).replace("__ROOT__", str(ROOT)))
    # The file stack.py writes, in its format.
    targets = [f"127.0.0.1:{p}" for p in stack.worker_ports(2)]
    workers = [{"targets": targets, "labels": {"service": "worker"}}]
    (tmp_path / "workers.json").write_text(json.dumps(workers))
    (tmp_path / "spawned.json").write_text(json.dumps([]))
    replicas = [{"targets": ["127.0.0.1:8121"], "labels": {"service": "router"}}]
    (tmp_path / "replicas.json").write_text(json.dumps(replicas))
    _promtool(config)


def _jobs(path: Path) -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(path.read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_compose_prometheus_scrapes_every_service_by_its_compose_name() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.compose.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    jobs = _jobs(PROMETHEUS / "prometheus.compose.yml")
    assert set(jobs) == {*SERVICES, "prometheus"}
    for service in SERVICES:
        (sd,) = jobs[service]["dns_sd_configs"]
        assert (sd["names"], sd["type"], sd["port"]) == ([service], "A", SERVICE_PORTS[service])
        assert service in COMPOSE["services"]
        assert {"target_label": "service", "replacement": service} in jobs[service]["relabel_configs"]


def test_local_prometheus_scrapes_the_local_stack() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.local.yml").read_text())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["__ROOT__/ops/prometheus/rules/*.yml"]
    jobs = _jobs(PROMETHEUS / "prometheus.local.yml")
    assert set(jobs) == {*SERVICES, "prometheus", "spawned", "replicas"}
    for service in ("producer", "router", "aggregator"):
        (static,) = jobs[service]["static_configs"]
        assert static == {"targets": [f"127.0.0.1:{SERVICE_PORTS[service]}"], "labels": {"service": service}}
    (file_sd,) = jobs["worker"]["file_sd_configs"]
    assert file_sd == {"files": ["__STACK__/workers.json"], "refresh_interval": "5s"}
    (spawned,) = jobs["spawned"]["file_sd_configs"]
    assert spawned == {"files": ["__STACK__/spawned.json"], "refresh_interval": "5s"}
    (replicas,) = jobs["replicas"]["file_sd_configs"]
    assert replicas == {"files": ["__STACK__/replicas.json"], "refresh_interval": "5s"}
    assert jobs["prometheus"]["static_configs"][0]["targets"] == [
        f"127.0.0.1:{stack.PROM_PORT - STACK_OFFSET}"
    ]


def test_grafana_provisions_the_compose_prometheus_and_the_boards_folder() -> None:
    grafana = COMPOSE["services"]["grafana"]
    mounts = dict(str(v).split(":")[:2][::-1] for v in grafana["volumes"])
    assert mounts["/etc/grafana/provisioning"] == "./ops/grafana/provisioning"
    boards = mounts["/etc/grafana/dashboards"]
    assert boards == "./ops/grafana/dashboards"
    provisioning = ROOT / "ops/grafana/provisioning"
    (datasource,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    prometheus_port = published_ports(COMPOSE["services"]["prometheus"])[0][2]
    assert datasource["url"] == f"http://prometheus:{prometheus_port}"
    assert datasource["uid"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards/evalstream.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
