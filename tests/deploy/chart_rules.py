"""What the services themselves need from a deployment, checked on the objects of a rendered
Helm chart (tests/deploy/chart.py renders them): probes on the ports and paths the services
answer, secrets from Secrets, a ScaledObject per group on that group's lag, GPUs where a group
says it runs on one, time to drain on SIGTERM."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evalstream.common import topics
from evalstream.common.settings import DEFAULTS, SERVICE_PORTS

ROOT = Path(__file__).resolve().parents[2]

# The seed's probe settings (issue 19): every liveness and readiness probe, unless a value set
# overrides them on purpose.
PROBE_NUMBERS = {"periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3, "initialDelaySeconds": 15}
# Variables that hold credentials: only ever from a Secret.
SECRET_VARIABLES = {"DATABASE_URL", "S3_ACCESS_KEY", "S3_SECRET_KEY", "KAFKA_PASSWORD"}
# What each component reads from the stores, each with credentials of its own (db_roles.py,
# s3_identities.py): workers the database only, the router neither.
NEEDS_DATABASE = {"producer", "aggregator", "worker", "bootstrap"}
NEEDS_S3 = {"producer", "aggregator", "bootstrap"}
# Kafka authentication settings (issue 12) the chart already sets; they are settings.py
# names once that lands, and allowed here until then.
KAFKA_AUTH_VARIABLES = {
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_USERNAME",
    "KAFKA_PASSWORD",
    "KAFKA_SSL_CAFILE",
}


@functools.cache
def drain_seconds(component: str) -> float:
    """How long a component may take to stop after SIGTERM, read from the code: uvicorn's
    graceful shutdown of HTTP (service.run), then the broker's wait for in-flight handlers
    (make_broker's graceful_timeout, as the service's app.py passes it)."""
    service_py = ast.parse((ROOT / "libs/common/evalstream/common/service.py").read_text())
    http = broker_default = None
    for node in ast.walk(service_py):
        if isinstance(node, ast.keyword) and node.arg == "timeout_graceful_shutdown":
            http = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name == "make_broker":
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True):
                if arg.arg == "graceful_timeout" and default is not None:
                    broker_default = ast.literal_eval(default)
    assert http is not None and broker_default is not None, "service.py changed shape"
    if component == "bootstrap":
        return 0.0
    app = ast.parse((ROOT / f"services/{component}/evalstream/{component}/app.py").read_text())
    broker = broker_default
    for node in ast.walk(app):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("make_broker"):
            for kw in node.keywords:
                if kw.arg == "graceful_timeout":
                    broker = ast.literal_eval(kw.value)
    return float(http + broker)


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod spec) of every Deployment and Job."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj, obj["spec"]["template"]["spec"]


def component_of(workload: dict[str, Any]) -> str:
    return workload["metadata"]["labels"]["app.kubernetes.io/component"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def plain_env(container: dict[str, Any]) -> dict[str, str]:
    return {name: str(e["value"]) for name, e in env_of(container).items() if "value" in e}


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (c,) = by_kind(objects, "Deployment")[deployment]["spec"]["template"]["spec"]["containers"]
    return c


def _port(container: dict[str, Any], port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    return None


def service_problems(objects: list[dict[str, Any]], numbers: dict[str, int]) -> list[str]:
    """What in valid objects would keep the services from working: each rule below, in turn
    (`numbers`: the probe settings every probe must have)."""
    out = _probe_problems(objects, numbers)
    out += _secret_problems(objects)
    out += _scaling_problems(objects)
    out += _gpu_problems(objects)
    out += _drain_and_disruption_problems(objects)
    return out


def _probe_problems(objects: list[dict[str, Any]], numbers: dict[str, int]) -> list[str]:
    out = []
    for workload, spec in pod_templates(objects):
        component = component_of(workload)
        if component not in SERVICE_PORTS:
            continue
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        (container,) = spec["containers"]
        env = plain_env(container)
        if env.get("HTTP_PORT") != str(SERVICE_PORTS[component]):
            out.append(
                f"{where}: HTTP_PORT is {env.get('HTTP_PORT')}, the {component} serves {SERVICE_PORTS[component]}"
            )
        if env.get("HTTP_HOST") != "0.0.0.0":
            out.append(
                f"{where}: HTTP_HOST is {env.get('HTTP_HOST')!r}: probes from the kubelet would not reach it"
            )
        expected = {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
        if component == "worker":
            expected["startupProbe"] = "/readyz"  # the model loads after /healthz answers
        for kind, path in expected.items():
            probe = container.get(kind)
            if probe is None:
                out.append(f"{where}: no {kind}")
                continue
            get = probe.get("httpGet", {})
            port = _port(container, get.get("port", 0))
            if get.get("path") != path or port != SERVICE_PORTS[component]:
                out.append(
                    f"{where}: {kind} asks {get.get('path')} on port {port}; "
                    f"the {component} answers {path} on {SERVICE_PORTS[component]}"
                )
            if kind != "startupProbe":
                for key, value in numbers.items():
                    if probe.get(key) != value:
                        out.append(f"{where}: {kind}.{key} is {probe.get(key)}, expected {value}")
        annotations = workload["spec"]["template"]["metadata"].get("annotations") or {}
        if annotations.get("prometheus.io/scrape") == "true" and annotations.get("prometheus.io/port") != str(
            SERVICE_PORTS[component]
        ):
            out.append(f"{where}: scraped on port {annotations.get('prometheus.io/port')}")
    return out


def _secret_problems(objects: list[dict[str, Any]]) -> list[str]:
    out = []
    for workload, spec in pod_templates(objects):
        component = component_of(workload)
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        for container in spec["containers"]:
            env = env_of(container)
            plain = plain_env(container)
            # Provider keys: the variables WORKER_API_KEYS names (pattern=VARIABLE,...).
            api_keys = {
                entry.rpartition("=")[2]
                for entry in plain.get("WORKER_API_KEYS", "").split(",")
                if "=" in entry
            }
            needed = set(api_keys)
            if component in NEEDS_DATABASE:
                needed |= {"DATABASE_URL"}
            if component in NEEDS_S3:
                needed |= {"S3_ACCESS_KEY", "S3_SECRET_KEY"}
            elif {"S3_ACCESS_KEY", "S3_SECRET_KEY"} & set(env):
                out.append(f"{where}: S3 keys, which a {component} must not have (s3_identities.py)")
            if component not in NEEDS_DATABASE and "DATABASE_URL" in env:
                out.append(f"{where}: a DATABASE_URL, which a {component} must not have (db_roles.py)")
            if plain.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").startswith("SASL"):
                needed |= {"KAFKA_PASSWORD"}
                if not plain.get("KAFKA_USERNAME"):
                    out.append(f"{where}: SASL without a KAFKA_USERNAME")
            for name in sorted(needed | (SECRET_VARIABLES & set(env))):
                ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
                if not (ref.get("name") and ref.get("key")):
                    how = "set inline" if name in plain else "missing"
                    out.append(f"{where}: {name} is {how}, not taken from a Secret (secretKeyRef)")
            unknown = set(env) - set(DEFAULTS) - KAFKA_AUTH_VARIABLES - api_keys
            if unknown:
                out.append(f"{where}: sets {sorted(unknown)}, which settings.py does not read")
        for volume in spec.get("volumes", []):
            if "secret" in volume and not volume["secret"].get("secretName"):
                out.append(f"{where}: volume {volume['name']} names no Secret")
    return out


def _scaling_problems(objects: list[dict[str, Any]]) -> list[str]:
    out = []
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    auths = {o["metadata"]["name"] for o in objects if o["kind"] == "TriggerAuthentication"}
    for so in (o for o in objects if o["kind"] == "ScaledObject"):
        where = f"ScaledObject/{so['metadata']['name']}"
        target = so["spec"]["scaleTargetRef"]
        deployment = deployments.get(target["name"])
        if target.get("kind", "Deployment") != "Deployment" or deployment is None:
            out.append(
                f"{where}: scales {target.get('kind', 'Deployment')}/{target['name']}, which is not rendered"
            )
            continue
        if component_of(deployment) != "worker":
            out.append(f"{where}: scales a {component_of(deployment)}, not a worker group")
            continue
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = plain_env(container)
        group = env["WORKER_GROUP"]
        prefix = env.get("KAFKA_TOPIC_PREFIX", "")
        # topics.py names them; its PREFIX is this process's (empty in the tests)
        assert topics.PREFIX == ""
        lag = [
            t
            for t in so["spec"]["triggers"]
            if t["metadata"].get("topic") == prefix + topics.work_topic(group)
        ]
        if not lag:
            out.append(
                f"{where}: no trigger on {prefix + topics.work_topic(group)}, the work topic of group {group}"
            )
        for trigger in so["spec"]["triggers"]:
            meta = trigger["metadata"]
            if trigger["type"] != "kafka":
                out.append(f"{where}: trigger {trigger['type']}")
                continue
            if meta.get("bootstrapServers") != env["KAFKA_BOOTSTRAP"]:
                out.append(
                    f"{where}: watches {meta.get('bootstrapServers')}, the group uses {env['KAFKA_BOOTSTRAP']}"
                )
            if trigger in lag and meta.get("consumerGroup") != prefix + topics.worker_consumer_group(group):
                out.append(
                    f"{where}: watches consumer group {meta.get('consumerGroup')}, the workers of {group} "
                    f"consume as {prefix + topics.worker_consumer_group(group)}"
                )
            if env.get("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").startswith("SASL"):
                ref = (trigger.get("authenticationRef") or {}).get("name")
                if ref not in auths or not meta.get("sasl"):
                    out.append(f"{where}: the brokers want SASL, the trigger has no authentication")
        if so["spec"].get("maxReplicaCount", 100) > topics.WORK_PARTITIONS:
            out.append(
                f"{where}: up to {so['spec']['maxReplicaCount']} replicas on {topics.WORK_PARTITIONS} partitions"
            )
        if "replicas" in deployment["spec"]:
            out.append(f"{where}: Deployment/{target['name']} sets replicas, which KEDA owns")
    return out


def _gpu_problems(objects: list[dict[str, Any]]) -> list[str]:
    out = []
    for workload, spec in pod_templates(objects):
        if component_of(workload) != "worker":
            continue
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        accelerator = workload["spec"]["template"]["metadata"]["labels"].get("evalstream.dev/accelerator")
        (container,) = spec["containers"]
        limits = container.get("resources", {}).get("limits", {})
        gpus = int(limits.get("nvidia.com/gpu", 0))
        models = plain_env(container).get("WORKER_MODEL", DEFAULTS["WORKER_MODEL"])
        if accelerator == "gpu" and gpus < 1:
            out.append(f"{where}: a GPU group that requests no nvidia.com/gpu")
        if accelerator != "gpu" and gpus > 0:
            out.append(f"{where}: requests {gpus} nvidia.com/gpu but is not labelled a GPU group")
        if accelerator not in ("cpu", "gpu") and any(m.strip().startswith("hf:") for m in models.split(",")):
            out.append(f"{where}: serves a local model ({models}) without saying cpu or gpu")
    return out


def _drain_and_disruption_problems(objects: list[dict[str, Any]]) -> list[str]:
    out = []
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    for workload, spec in pod_templates(objects):
        component = component_of(workload)
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        if workload["kind"] != "Deployment":
            continue
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if grace < drain_seconds(component):
            out.append(
                f"{where}: terminationGracePeriodSeconds {grace} < the {component}'s drain, {drain_seconds(component):g} s"
            )
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if not any(
            all(labels.get(k) == v for k, v in b["spec"]["selector"]["matchLabels"].items()) for b in budgets
        ):
            out.append(f"{where}: no PodDisruptionBudget selects its pods")
    return out
