"""The Helm chart (ops/helm/evalstream) rendered and checked offline: `helm template`, every
object against its schema (the Kubernetes JSON schemas of the kubernetes-validate package; the
KEDA and Prometheus Operator CRDs vendored in tests/deploy/schemas), then what the services
themselves need from a deployment (`problems`, its rules in tests/deploy/chart_rules.py).

helm is built from the Go module proxy on first use and cached (ops/local/localstack/installs.py)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

from tests.deploy.chart_rules import PROBE_NUMBERS, ROOT, service_problems

# Also read as chart.<name> by tests/deploy/test_helm_chart_*.py and tests/unit/test_compose_shape.py.
from tests.deploy.chart_rules import component_of as component_of
from tests.deploy.chart_rules import drain_seconds as drain_seconds
from tests.deploy.chart_rules import env_of as env_of
from tests.deploy.chart_rules import plain_env as plain_env

CHART = ROOT / "ops/helm/evalstream"
HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas"
VALUES = HERE / "values"
KUBE_VERSION = "1.33.0"  # the oldest Kubernetes the checks hold the chart to (Chart.yaml: >= 1.30)
RELEASE = "es"
NAMESPACE = "evalstream"
# The good value sets in tests/deploy/values (tests/deploy/conftest.py renders each once).
VALUE_SETS = ("cpu", "gpu", "autoscaled")
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}


class RenderError(Exception):
    """helm refused the values (schema, a `fail` in a template): its message."""


# --------------------------------------------------------------------------- helm


@functools.cache
def helm() -> Path:
    """The helm binary, built and cached on first use (a cold machine: a few minutes)."""
    sys.path.insert(0, str(ROOT / "ops/local"))
    try:
        from localstack.installs import helm_binary
    finally:
        sys.path.remove(str(ROOT / "ops/local"))
    return helm_binary()


def _values_args(values: Sequence[Path | dict[str, Any]], tmp: Path) -> list[str]:
    args = []
    for i, v in enumerate(values):
        if isinstance(v, dict):
            path = tmp / f"values-{i}.yaml"
            path.write_text(yaml.safe_dump(v))
            v = path
        args += ["-f", str(v)]
    return args


def render(values: Sequence[Path | dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """`helm template` with these value files (or dicts), every object it renders."""
    cmd = [
        str(helm()),
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        *_values_args(values, tmp),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def lint(values: Sequence[Path | dict[str, Any]], tmp: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        str(helm()),
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        *_values_args(values, tmp),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def planted(name: str) -> tuple[str, dict[str, Any]]:
    """A planted bad value set: (the message that must name the problem, the values)."""
    doc = yaml.safe_load((VALUES / "bad" / f"{name}.yaml").read_text())
    return doc["expect"], doc["values"]


# --------------------------------------------------------------------------- schemas


@functools.cache
def _kubernetes_schemas() -> tuple[Path, Registry]:
    folder = (
        Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBE_VERSION}-local-strict"
    )
    definitions = Resource.from_contents(json.loads((folder / "_definitions.json").read_text()))
    return folder, definitions @ Registry()


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    if (api_version, kind) in CRDS:
        crd = yaml.safe_load((SCHEMAS / CRDS[(api_version, kind)]).read_text())
        group, _, version = api_version.partition("/")
        assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
        (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        return jsonschema.Draft7Validator(_closed(entry["schema"]["openAPIV3Schema"]))
    folder, registry = _kubernetes_schemas()
    group = api_version.split("/")[0].split(".")[0] if "/" in api_version else ""
    version = api_version.split("/")[-1]
    name = f"{kind.lower()}-{group}-{version}.json" if group else f"{kind.lower()}-{version}.json"
    path = folder / name
    if not path.exists():
        raise AssertionError(f"no schema for {api_version} {kind} in Kubernetes {KUBE_VERSION}")
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=Resource.from_contents(schema) @ registry)


def _closed(schema: Any) -> Any:
    """A CRD's schema as the API server applies it under strict field validation (kubectl's
    default): an unknown field is an error, except where the schema preserves unknown fields."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Where `obj` breaks its kind's schema (strict: no unknown fields)."""
    validator = _validator(obj["apiVersion"], obj["kind"])
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    return [
        f"{where}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def problems(objects: list[dict[str, Any]], probe_numbers: dict[str, int] | None = None) -> list[str]:
    """Everything in a rendered chart that would keep the services from working: schema
    errors first, then each rule of tests/deploy/chart_rules.py."""
    numbers = PROBE_NUMBERS if probe_numbers is None else probe_numbers
    out: list[str] = []
    for obj in objects:
        out += schema_errors(obj)
    out += service_problems(objects, numbers)
    return out
