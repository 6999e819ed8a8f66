"""The Helm chart renders, lints and validates for a CPU-only, a GPU and an autoscaled value
set (and with a topic prefix), and what it renders is what the services need: one Deployment
per worker group, probes, grace periods, secrets from Secrets, GPUs, KEDA scaling on each
group's lag, metrics and boards, settings and topics as topics.py names them.

No cluster here: `helm template` (helm built from the Go module proxy on first use), the
Kubernetes JSON schemas and the vendored KEDA / Prometheus Operator CRDs (tests/deploy/chart.py).
Planted faults: tests/deploy/test_helm_chart_planted.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalstream.common import topics
from evalstream.common.settings import SERVICE_PORTS
from tests.deploy import chart
from tests.deploy.chart import VALUE_SETS
from tests.deploy.chart_rules import by_kind, container

CPU_VALUES = yaml.safe_load((chart.VALUES / "cpu.yaml").read_text())


# --------------------------------------------------------------------------- the good value sets


@pytest.mark.parametrize("name", ["default", *VALUE_SETS])
def test_helm_lint_passes(name: str, tmp_path: Path) -> None:
    values = [] if name == "default" else [chart.VALUES / f"{name}.yaml"]
    result = chart.lint(values, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", VALUE_SETS)
def test_value_set_renders_valid_objects_with_nothing_to_fix(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[name]
    assert chart.problems(objects) == []
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "PodDisruptionBudget", "Job", "ConfigMap", "ServiceAccount"} <= kinds


def test_default_values_render_valid_objects(tmp_path: Path) -> None:
    assert chart.problems(chart.render([], tmp_path)) == []


def test_one_deployment_per_worker_group_and_one_per_service(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name in VALUE_SETS:
        groups = [
            g["name"] for g in yaml.safe_load((chart.VALUES / f"{name}.yaml").read_text())["workerGroups"]
        ]
        deployments = by_kind(rendered[name], "Deployment")
        expected = {f"es-evalstream-{c}" for c in ("producer", "router", "aggregator")}
        expected |= {f"es-evalstream-worker-{g}" for g in groups}
        assert set(deployments) == expected, name
        for g in groups:
            env = chart.plain_env(container(rendered[name], f"es-evalstream-worker-{g}"))
            assert env["WORKER_GROUP"] == g
        # the bootstrap Job makes every group's work topic
        (job,) = by_kind(rendered[name], "Job").values()
        assert chart.plain_env(job["spec"]["template"]["spec"]["containers"][0])["WORKER_GROUPS"] == ",".join(
            groups
        )


def test_probes_have_the_seed_settings_and_the_services_ports(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["cpu"]
    for name, deployment in by_kind(objects, "Deployment").items():
        component = chart.component_of(deployment)
        c = container(objects, name)
        assert c["ports"] == [{"name": "http", "containerPort": SERVICE_PORTS[component]}]
        for kind, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            probe = c[kind]
            assert probe["httpGet"] == {"path": path, "port": "http"}
            assert {k: probe[k] for k in chart.PROBE_NUMBERS} == chart.PROBE_NUMBERS
        if component == "worker":
            # the model may take minutes to load: the startup probe waits for /readyz first
            startup = c["startupProbe"]
            assert startup["httpGet"] == {"path": "/readyz", "port": "http"}
            load = {g["name"]: g["modelLoadTimeoutSeconds"] for g in CPU_VALUES["workerGroups"]}
            group = chart.plain_env(c)["WORKER_GROUP"]
            assert startup["periodSeconds"] * startup["failureThreshold"] >= load[group]
        else:
            assert "startupProbe" not in c


def test_grace_period_covers_each_services_drain(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert chart.drain_seconds("worker") == 60 + 120  # uvicorn's HTTP shutdown + the worker's round
    assert chart.drain_seconds("router") == 60 + 30
    for name, deployment in by_kind(rendered["gpu"], "Deployment").items():
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= chart.drain_seconds(chart.component_of(deployment)), name


def test_secrets_come_from_secrets_only(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["autoscaled"]
    assert not by_kind(objects, "Secret"), "the chart names Secrets, it never holds credentials"
    refs: dict[str, dict[str, str]] = {}
    for name in by_kind(objects, "Deployment"):
        for var, e in chart.env_of(container(objects, name)).items():
            if "valueFrom" in e:
                refs.setdefault(name, {})[var] = e["valueFrom"]["secretKeyRef"]["name"]
    # one Kafka principal per service
    assert refs["es-evalstream-producer"]["KAFKA_PASSWORD"] == "evalstream-producer"
    assert refs["es-evalstream-router"]["KAFKA_PASSWORD"] == "evalstream-router"
    assert refs["es-evalstream-aggregator"]["KAFKA_PASSWORD"] == "evalstream-aggregator"
    assert refs["es-evalstream-worker-llama-8b-l4"]["KAFKA_PASSWORD"] == "evalstream-worker"
    # and one database role and S3 key pair per service (db_roles.py, s3_identities.py)
    assert refs["es-evalstream-producer"]["DATABASE_URL"] == "evalstream-database-producer"
    assert refs["es-evalstream-aggregator"]["DATABASE_URL"] == "evalstream-database-aggregator"
    assert refs["es-evalstream-worker-llama-8b-l4"]["DATABASE_URL"] == "evalstream-database-worker"
    assert refs["es-evalstream-producer"]["S3_SECRET_KEY"] == "evalstream-s3-producer"
    assert refs["es-evalstream-aggregator"]["S3_SECRET_KEY"] == "evalstream-s3-aggregator"
    assert "S3_ACCESS_KEY" not in refs["es-evalstream-worker-llama-8b-l4"], "workers never touch the store"
    assert "DATABASE_URL" not in refs["es-evalstream-router"], "the router needs no stores"
    job = next(o for o in objects if o["kind"] == "Job")
    job_refs = {
        var: e["valueFrom"]["secretKeyRef"]["name"]
        for var, e in chart.env_of(job["spec"]["template"]["spec"]["containers"][0]).items()
        if "valueFrom" in e
    }
    assert (job_refs["DATABASE_URL"], job_refs["S3_ACCESS_KEY"]) == (
        "evalstream-database-owner",
        "evalstream-s3-admin",
    )
    env = chart.plain_env(container(objects, "es-evalstream-router"))
    assert (env["KAFKA_SECURITY_PROTOCOL"], env["KAFKA_SASL_MECHANISM"], env["KAFKA_USERNAME"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "evalstream-router",
    )
    assert env["KAFKA_SSL_CAFILE"] == "/etc/evalstream/kafka-ca/ca.crt"
    # provider keys: mapped by endpoint, from a Secret
    cpu = rendered["cpu"]
    deepseek = container(cpu, "es-evalstream-worker-deepseek")
    assert chart.plain_env(deepseek)["WORKER_API_KEYS"] == "https://api.deepseek.com/*=DEEPSEEK_API_KEY"
    assert chart.env_of(deepseek)["DEEPSEEK_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "evalstream-provider-keys",
        "key": "deepseek",
    }


def test_gpu_groups_request_gpus_and_cpu_groups_do_not(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["gpu"]
    gpu = by_kind(objects, "Deployment")["es-evalstream-worker-qwen-7b-a100"]["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu["tolerations"]
    cpu = by_kind(objects, "Deployment")["es-evalstream-worker-smollm2-cpu"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"].get("limits", {})
    assert "nodeSelector" not in cpu and "tolerations" not in cpu
    assert "nvidia.com/gpu" not in json.dumps(rendered["cpu"])


def test_keda_scales_each_group_on_its_own_lag(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["autoscaled"]
    scaled = by_kind(objects, "ScaledObject")
    assert set(scaled) == {"es-evalstream-worker-llama-8b-l4", "es-evalstream-worker-smollm2-cpu"}
    for group in ("llama-8b-l4", "smollm2-cpu"):
        so = scaled[f"es-evalstream-worker-{group}"]
        assert so["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": f"es-evalstream-worker-{group}",
        }
        lag = so["spec"]["triggers"][0]
        assert lag["type"] == "kafka" and lag["name"] == "work-lag"
        assert lag["metadata"]["topic"] == topics.work_topic(group)
        assert lag["metadata"]["consumerGroup"] == topics.worker_consumer_group(group)
        assert lag["metadata"]["lagThreshold"] == "4"
        assert (lag["metadata"]["sasl"], lag["metadata"]["tls"]) == ("scram_sha512", "enable")
        assert lag["authenticationRef"] == {"name": "es-evalstream-kafka"}
        assert "replicas" not in by_kind(objects, "Deployment")[f"es-evalstream-worker-{group}"]["spec"]
    gpu = scaled["es-evalstream-worker-llama-8b-l4"]["spec"]
    assert (gpu["minReplicaCount"], gpu["maxReplicaCount"]) == (0, 6)
    # from zero: the router parks a group's shards on eval.retry while it has no workers
    wake = gpu["triggers"][1]
    assert (wake["metadata"]["topic"], wake["metadata"]["consumerGroup"]) == (
        topics.RETRY,
        topics.RETRY_GROUP,
    )
    cpu = scaled["es-evalstream-worker-smollm2-cpu"]["spec"]
    assert (cpu["minReplicaCount"], cpu["maxReplicaCount"], len(cpu["triggers"])) == (1, 3, 1)
    (auth,) = by_kind(objects, "TriggerAuthentication").values()
    assert {r["parameter"]: r["name"] for r in auth["spec"]["secretTargetRef"]} == {
        "password": "evalstream-worker",
        "ca": "evalstream-cluster-ca-cert",
    }
    assert auth["spec"]["env"] == [
        {"parameter": "username", "name": "KAFKA_USERNAME", "containerName": "worker"}
    ]
    assert not by_kind(rendered["cpu"], "ScaledObject") and not by_kind(rendered["gpu"], "ScaledObject")


def test_metrics_are_scraped_and_the_boards_ship_as_a_configmap(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["gpu"]
    for deployment in by_kind(objects, "Deployment").values():
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        port = str(SERVICE_PORTS[chart.component_of(deployment)])
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": port,
            "prometheus.io/path": "/metrics",
        }
    monitors = by_kind(objects, "ServiceMonitor")
    assert len(monitors) == 3 + 2
    qwen = monitors["es-evalstream-worker-qwen-7b-a100"]
    assert qwen["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = qwen["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    # the alert rules and boards select on service=<component>
    assert {"targetLabel": "service", "replacement": "worker", "action": "replace"} in endpoint["relabelings"]
    services = by_kind(objects, "Service")
    selector = services["es-evalstream-worker-qwen-7b-a100"]["spec"]["selector"]
    assert all(qwen["spec"]["selector"]["matchLabels"][k] == v for k, v in selector.items())
    (boards,) = by_kind(objects, "ConfigMap").values()
    assert boards["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = sorted(p.name for p in (chart.ROOT / "ops/grafana/dashboards").glob("*.json"))
    assert sorted(boards["data"]) == shipped and len(shipped) >= 4
    assert sum(len(v.encode()) for v in boards["data"].values()) < 1024 * 1024  # a ConfigMap's limit
    for name in shipped:
        assert json.loads(boards["data"][name]) == json.loads(
            (chart.ROOT / "ops/grafana/dashboards" / name).read_text()
        )


def test_chart_sets_only_settings_and_mirrors_topics_py(rendered: dict[str, list[dict[str, Any]]]) -> None:
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert values["kafka"]["workPartitions"] == topics.WORK_PARTITIONS
    assert values["autoscaling"]["maxReplicas"] <= topics.WORK_PARTITIONS
    assert {k: values["probes"][k] for k in chart.PROBE_NUMBERS} == chart.PROBE_NUMBERS
    ports = (chart.CHART / "templates/_helpers.tpl").read_text()
    for component, port in SERVICE_PORTS.items():
        assert f'"{component}" {port}' in ports, component


def test_topic_prefix_reaches_the_services_and_the_triggers(tmp_path: Path) -> None:
    """KAFKA_TOPIC_PREFIX renames every topic and consumer group (topics.py): KEDA must watch the
    prefixed ones."""
    objects = chart.render(
        [chart.VALUES / "autoscaled.yaml", {"kafka": {"topicPrefix": "team-a."}}], tmp_path
    )
    assert chart.problems(objects) == []
    so = by_kind(objects, "ScaledObject")["es-evalstream-worker-llama-8b-l4"]
    watched = [(t["metadata"]["topic"], t["metadata"]["consumerGroup"]) for t in so["spec"]["triggers"]]
    assert watched == [
        (
            "team-a." + topics.work_topic("llama-8b-l4"),
            "team-a." + topics.worker_consumer_group("llama-8b-l4"),
        ),
        ("team-a." + topics.RETRY, "team-a." + topics.RETRY_GROUP),
    ]
    for name in by_kind(objects, "Deployment"):
        assert chart.plain_env(container(objects, name))["KAFKA_TOPIC_PREFIX"] == "team-a.", name
    # and the checks see a trigger left on the unprefixed topic
    so["spec"]["triggers"][0]["metadata"]["topic"] = topics.work_topic("llama-8b-l4")
    assert any("no trigger on team-a.eval.work.llama-8b-l4" in p for p in chart.problems(objects))
