"""The Helm chart's checks refuse what would break a deployment: planted bad value sets (refused
at render by values.schema.json or a template's `fail`, or rendered and refused by the checks),
and the same faults planted in a rendered chart, as a broken template would produce them.

No cluster here (tests/deploy/chart.py). The good value sets: tests/deploy/test_helm_chart_values.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evalstream.common import topics
from tests.deploy import chart
from tests.deploy.chart_rules import by_kind, container

# --------------------------------------------------------------------------- planted: bad values


@pytest.mark.parametrize(
    "name",
    [
        "broken-probe",
        "missing-secret",
        "scaledobject-unknown-group",
        "gpu-without-request",
        "too-many-replicas",
    ],
)
def test_planted_bad_values_are_refused_at_render(name: str, tmp_path: Path) -> None:
    expect, values = chart.planted(name)
    with pytest.raises(chart.RenderError) as refused:
        chart.render([values], tmp_path)
    assert expect in str(refused.value), str(refused.value)
    # helm lint fails on a schema error; a template's `fail` it only reports (as INFO)
    linted = chart.lint([values], tmp_path)
    assert linted.returncode != 0 or expect in linted.stderr, linted.stderr


def test_planted_unmapped_api_key_renders_and_the_checks_refuse_it(tmp_path: Path) -> None:
    expect, values = chart.planted("unmapped-api-key")
    found = chart.problems(chart.render([values], tmp_path))
    assert found == [
        "Deployment/es-evalstream-worker-deepseek: DEEPSEEK_API_KEY is missing, not taken from a Secret (secretKeyRef)"
    ]
    assert expect in found[0]


# --------------------------------------------------------------------------- planted: bad objects

Mutation = Callable[[list[dict[str, Any]]], None]


def _worker(objects: list[dict[str, Any]], group: str) -> dict[str, Any]:
    return container(objects, f"es-evalstream-worker-{group}")


def _wrong_probe_port(objects: list[dict[str, Any]]) -> None:
    container(objects, "es-evalstream-router")["readinessProbe"]["httpGet"]["port"] = 8080


def _wrong_probe_path(objects: list[dict[str, Any]]) -> None:
    container(objects, "es-evalstream-aggregator")["livenessProbe"]["httpGet"]["path"] = "/health"


def _probe_port_apart_from_http_port(objects: list[dict[str, Any]]) -> None:
    for e in _worker(objects, "smollm2-cpu")["env"]:
        if e["name"] == "HTTP_PORT":
            e["value"] = "8111"


def _secret_inline(objects: list[dict[str, Any]]) -> None:
    for e in container(objects, "es-evalstream-producer")["env"]:
        if e["name"] == "DATABASE_URL":
            e.pop("valueFrom")
            e["value"] = "postgresql://evalstream:hunter2@db:5432/evalstream"


def _secret_dropped(objects: list[dict[str, Any]]) -> None:
    c = container(objects, "es-evalstream-aggregator")
    c["env"] = [e for e in c["env"] if e["name"] != "S3_SECRET_KEY"]


def _kafka_password_dropped(objects: list[dict[str, Any]]) -> None:
    c = container(objects, "es-evalstream-router")
    c["env"] = [e for e in c["env"] if e["name"] != "KAFKA_PASSWORD"]


def _scaledobject_to_missing_group(objects: list[dict[str, Any]]) -> None:
    by_kind(objects, "ScaledObject")["es-evalstream-worker-smollm2-cpu"]["spec"]["scaleTargetRef"]["name"] = (
        "es-evalstream-worker-smollm-cpu"
    )


def _scaledobject_on_other_groups_topic(objects: list[dict[str, Any]]) -> None:
    so = by_kind(objects, "ScaledObject")["es-evalstream-worker-smollm2-cpu"]
    so["spec"]["triggers"][0]["metadata"]["topic"] = topics.work_topic("llama-8b-l4")


def _scaledobject_wrong_consumer_group(objects: list[dict[str, Any]]) -> None:
    so = by_kind(objects, "ScaledObject")["es-evalstream-worker-smollm2-cpu"]
    so["spec"]["triggers"][0]["metadata"]["consumerGroup"] = "smollm2-cpu"


def _gpu_request_dropped(objects: list[dict[str, Any]]) -> None:
    del _worker(objects, "qwen-7b-a100")["resources"]["limits"]["nvidia.com/gpu"]


def _short_grace(objects: list[dict[str, Any]]) -> None:
    deployment = by_kind(objects, "Deployment")["es-evalstream-worker-qwen-7b-a100"]
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30


def _unknown_field(objects: list[dict[str, Any]]) -> None:
    container(objects, "es-evalstream-producer")["livenessProbe"]["httpGet"]["paht"] = "/healthz"


def _keda_unknown_field(objects: list[dict[str, Any]]) -> None:
    by_kind(objects, "ScaledObject")["es-evalstream-worker-smollm2-cpu"]["spec"]["maxReplicas"] = 3


PLANTED_OBJECTS: dict[str, tuple[str, Mutation, str]] = {
    "wrong probe port": ("cpu", _wrong_probe_port, "readinessProbe asks /readyz on port 8080"),
    "wrong probe path": ("cpu", _wrong_probe_path, "livenessProbe asks /health on port 8104"),
    "HTTP_PORT apart from the probes": ("cpu", _probe_port_apart_from_http_port, "HTTP_PORT is 8111"),
    "secret inline": ("cpu", _secret_inline, "DATABASE_URL is set inline"),
    "secret dropped": ("cpu", _secret_dropped, "S3_SECRET_KEY is missing"),
    "Kafka password dropped": ("autoscaled", _kafka_password_dropped, "KAFKA_PASSWORD is missing"),
    "ScaledObject on a missing group": (
        "autoscaled",
        _scaledobject_to_missing_group,
        "which is not rendered",
    ),
    "ScaledObject on another group's topic": (
        "autoscaled",
        _scaledobject_on_other_groups_topic,
        "no trigger on eval.work.smollm2-cpu",
    ),
    "ScaledObject on a wrong consumer group": (
        "autoscaled",
        _scaledobject_wrong_consumer_group,
        "consume as evalstream-worker-smollm2-cpu",
    ),
    "GPU request dropped": ("gpu", _gpu_request_dropped, "a GPU group that requests no nvidia.com/gpu"),
    "grace shorter than the drain": (
        "gpu",
        _short_grace,
        "terminationGracePeriodSeconds 30 < the worker's drain, 180 s",
    ),
    "unknown field (Kubernetes schema)": ("cpu", _unknown_field, "'paht' was unexpected"),
    "unknown field (KEDA CRD schema)": ("autoscaled", _keda_unknown_field, "'maxReplicas' was unexpected"),
}


@pytest.mark.parametrize("fault", PLANTED_OBJECTS)
def test_planted_fault_in_rendered_objects_is_caught(
    fault: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    value_set, mutate, expect = PLANTED_OBJECTS[fault]
    objects = copy.deepcopy(rendered[value_set])
    mutate(objects)
    found = chart.problems(objects)
    assert any(expect in p for p in found), found
