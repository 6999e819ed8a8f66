"""Settings: declared once with their types, read in groups, every variable through them."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from evalstream.common.settings import (
    DEFAULTS,
    AggregatorSettings,
    ProducerSettings,
    RouterSettings,
    Settings,
    TelemetrySettings,
    TopicSettings,
    WorkerSettings,
)


def test_values_are_converted_to_the_declared_types() -> None:
    s = Settings.from_env(
        {
            "HTTP_PORT": "8123",
            "HEARTBEAT_INTERVAL_S": "0.5",
            "ROUTER_MAX_LAG": "7",
            "OTEL_SDK_DISABLED": "TRUE",
            "WORKER_MODEL": "null",
        }
    )
    assert (s.http_port, s.heartbeat_interval_s, s.router_max_lag) == (8123, 0.5, 7)
    assert s.otel_sdk_disabled is True and s.worker_model == "null"
    assert Settings.from_env({}) == Settings()  # nothing set: the declared defaults


@pytest.mark.parametrize(
    ("name", "value"), [("HTTP_PORT", "80x"), ("ROUTER_SLA_P95_MS", "fast"), ("OTEL_SDK_DISABLED", "maybe")]
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"environment variable {name}="):
        Settings.from_env({name: value})


def test_defaults_list_every_variable_and_read_back_as_the_defaults() -> None:
    assert set(DEFAULTS) == {f.name.upper() for f in fields(Settings)}
    assert Settings.from_env(DEFAULTS) == Settings()
    assert DEFAULTS["KAFKA_BOOTSTRAP"] == "127.0.0.1:9092"
    assert DEFAULTS["WORKER_MODEL"] == (
        "smollm2-135m-instruct,hf:smollm2-135m-instruct,ov:smollm2-135m-instruct,null,replay:*"
    )
    assert float(DEFAULTS["ROUTER_PARK_AFTER_S"]) == 5 and int(DEFAULTS["BATCH_MAX_ITEMS"]) == 0


def test_each_service_reads_only_its_own_group() -> None:
    names = {cls: {f.name for f in fields(cls)} for cls in (WorkerSettings, RouterSettings, ProducerSettings)}
    assert "worker_model" in names[WorkerSettings] and "worker_model" not in names[RouterSettings]
    assert "router_policy" in names[RouterSettings] and "router_policy" not in names[WorkerSettings]
    assert not any(n.startswith("s3_") or n == "database_url" for n in names[RouterSettings])
    assert "fault_inject" in {f.name for f in fields(AggregatorSettings)}
    assert "engine_faults" not in names[ProducerSettings]
    every = {f.name for f in fields(Settings)}
    assert all(n <= every for n in names.values())


def test_secrets_stay_out_of_reprs() -> None:
    text = repr(Settings.from_env({"S3_SECRET_KEY": "hunter2", "DATABASE_URL": "postgresql://u:pw@h/d"}))
    assert "hunter2" not in text and "pw@" not in text


def test_small_groups_read_only_their_variables() -> None:
    # topics.py and telemetry.py read theirs through these: a bad HTTP_PORT cannot break them
    env = {"KAFKA_TOPIC_PREFIX": "t1.", "HTTP_PORT": "not a port", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}
    assert TopicSettings.from_env(env).kafka_topic_prefix == "t1."
    assert TelemetrySettings.from_env(env).otel_exporter_otlp_endpoint == "http://c"


# Where the product touches the environment other than through settings.py, and why.
ENVIRONMENT_TOUCHES = {
    # the grading pool's children get a copy of the few variables Python needs to start
    "services/worker/evalstream/worker/grading_pool.py": "os.environ.items()",
    # MLflow's own switch for a file store, set for the library (a write, not a setting)
    "cli/evalstream/cli/trackers.py": "os.environ.setdefault(",
    # the task reader's child process gets the few variables Python needs, no credential
    "libs/common/evalstream/common/lmeval/isolation.py": "for k in _INHERITED",
}


# A read of the environment: os.environ, getenv (os.getenv, or imported), environ imported from os.
ENVIRONMENT_READ = re.compile(r"os\.environ\b|getenv\(|\bfrom\s+os\s+import\b.*\b(environ|getenv)\b")


def environment_reads(root: Path) -> list[str]:
    """path:line: text of every line of the product that reads the environment outside
    settings.py and ENVIRONMENT_TOUCHES."""
    found = []
    for top in ("services", "libs", "cli"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "libs/common/evalstream/common/settings.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if ENVIRONMENT_READ.search(code) and ENVIRONMENT_TOUCHES.get(rel, "\0") not in code:
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_every_variable_is_read_through_settings() -> None:
    found = environment_reads(Path(__file__).resolve().parents[2])
    assert found == [], "environment read outside settings.py:\n" + "\n".join(found)


def test_the_check_finds_every_way_of_reading_the_environment(tmp_path: Path) -> None:
    module = tmp_path / "services/router/evalstream/router/bad.py"
    module.parent.mkdir(parents=True)
    module.write_text("import os\nx = 1  # os.environ in a comment is no read\n")
    assert environment_reads(tmp_path) == []
    module.write_text(
        "import os\nfrom os import environ\nfrom os import getenv as g, sep\na = os.environ['A']\nb = os.getenv('B')\n"
    )
    assert [f.split(": ")[0] for f in environment_reads(tmp_path)] == [
        f"services/router/evalstream/router/bad.py:{n}" for n in (2, 3, 4, 5)
    ]
