"""docker-compose.yml and docker-compose.gpu.yml as Docker Compose itself reads them:
`docker-compose config` (no engine needed), the CLI built from the Go module proxy on first use
and cached (ops/local/localstack/installs.py). The schema and the settings are checked in
tests/unit/test_compose_shape.py and tests/unit/test_compose_env.py; here, what Compose resolves: the CPU default, the GPU override, and
that Compose refuses a broken file and a missing .env.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.deploy.chart import ROOT

GPU_RESERVATION = [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]


@functools.cache
def compose_cli() -> Path:
    sys.path.insert(0, str(ROOT / "ops/local"))
    try:
        from localstack.installs import compose_binary
    finally:
        sys.path.remove(str(ROOT / "ops/local"))
    return compose_binary()


def compose(*args: str, env_file: Path | None = ROOT / ".env.example") -> subprocess.CompletedProcess[str]:
    # Only the variables Compose itself reads: nothing from this shell leaks into the check.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    cmd = [str(compose_cli()), "--project-directory", str(ROOT)]
    if env_file is not None:
        cmd += ["--env-file", str(env_file)]
    return subprocess.run([*cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def config(*files: str) -> dict[str, Any]:
    args = [a for f in files for a in ("-f", f)]
    result = compose(*args, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_default_compose_file_runs_the_worker_on_the_cpu() -> None:
    resolved = config("docker-compose.yml")
    services = resolved["services"]
    assert set(services) == {
        "kafka",
        "postgres",
        "s3",
        "bootstrap",
        "prometheus",
        "grafana",
        "producer",
        "router",
        "worker",
        "aggregator",
    }
    worker = services["worker"]
    assert "devices" not in json.dumps(worker.get("deploy", {})) and "gpus" not in worker
    assert "nvidia" not in json.dumps(resolved).lower()
    assert worker["environment"]["WORKER_GROUP"] == "default"
    assert worker["environment"]["DEEPSEEK_API_KEY"] == ""  # empty unless .env gives one
    assert services["router"]["environment"]["ROUTER_POLICY"] == "weighted"


def test_gpu_override_reserves_one_gpu_per_worker() -> None:
    services = config("docker-compose.yml", "docker-compose.gpu.yml")["services"]
    assert services["worker"]["deploy"]["resources"]["reservations"]["devices"] == GPU_RESERVATION
    # everything else as in the default file
    default = config("docker-compose.yml")["services"]
    for name, service in services.items():
        if name != "worker":
            assert service == default[name], name


def test_env_file_settings_reach_the_services(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(
        (ROOT / ".env.example").read_text()
        + "\nROUTER_POLICY=least_outstanding\nDEEPSEEK_API_KEY=sk-test\n"
        + "WORKER_API_KEYS=https://api.deepseek.com/*=DEEPSEEK_API_KEY\n"
    )
    result = compose("config", "--format", "json", env_file=env)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert services["router"]["environment"]["ROUTER_POLICY"] == "least_outstanding"
    worker = services["worker"]["environment"]
    assert (worker["DEEPSEEK_API_KEY"], worker["WORKER_API_KEYS"]) == (
        "sk-test",
        "https://api.deepseek.com/*=DEEPSEEK_API_KEY",
    )
    assert "DEEPSEEK_API_KEY" not in services["producer"]["environment"]


def test_compose_refuses_a_broken_file_and_a_missing_env(tmp_path: Path) -> None:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    missing = compose("config", "--quiet", env_file=empty)
    assert missing.returncode != 0
    assert "set it in .env" in missing.stderr, missing.stderr  # the credentials have no defaults
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (ROOT / "docker-compose.yml")
        .read_text()
        .replace("stop_grace_period: 190s", "stop_grace_period: soon")
    )
    result = compose("-f", str(broken), "config", "--quiet")
    assert result.returncode != 0
    assert "stop_grace_period" in result.stderr or "soon" in result.stderr, result.stderr
