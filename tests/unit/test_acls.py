"""The ACL table (libs/common acls.py) against what each service does: every topic a
service subscribes to (with its consumer group) or publishes to is granted to its
principal, and nothing beyond that and the table's few documented extras is; the issue's
promises (the producer cannot write results, workers cannot write jobs, only users and the
admin publish jobs) hold; KAFKA_TOPIC_PREFIX prefixes every name."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evalstream.common import acls, topics

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {
    "producer": acls.PRODUCER,
    "router": acls.ROUTER,
    "worker": acls.WORKER,
    "aggregator": acls.AGGREGATOR,
}
BASE = [t.name for t in topics.BASE_TOPICS]
WORK = topics.work_topic("default")


def subscriptions(service: str) -> set[tuple[str, str | None]]:
    """(topic, consumer group) of every subscriber of the service's FastStream app."""
    app = importlib.import_module(f"evalstream.{service}.app")
    return {(t, s.group_id) for s in app.broker.subscribers for t in s.topic_names}


# `<broker>.publish(payload, <topic>, ...)` in a service's source; the topic as written.
PUBLISH = re.compile(r"\.publish\(\s*[^,]+,\s*([^,)]+)", re.S)


def published(service: str) -> set[str]:
    """Topics the service's code publishes to (the names it can resolve statically)."""
    out = set()
    for path in (ROOT / "services" / service).rglob("*.py"):
        for arg in PUBLISH.findall(path.read_text()):
            arg = arg.strip()
            if m := re.fullmatch(r"topics\.([A-Z_]+)", arg):
                out.add(getattr(topics, m.group(1)))
            elif arg.startswith("topics.work_topic("):
                out.add(WORK)
            elif arg == "self.retry_topic":  # the router's parking
                out.add(topics.RETRY)
    return out


def needs(service: str) -> set[tuple[str, str, str]]:
    """(resource, name, operation) the service's own code needs."""
    out = {("topic", topics.DLQ, "Write")}  # service.dead_letter: anything it cannot decode
    for topic, group in subscriptions(service):
        out.add(("topic", topic, "Read"))
        if group:
            out.add(("group", group, "Read"))
    out |= {("topic", t, "Write") for t in published(service)}
    # Kafka's implication: what a service reads or writes it may also describe
    return out | {(resource, name, "Describe") for resource, name, _ in out}


# Beyond subscriptions and publishes, on purpose (acls.py says why).
EXTRAS = {
    acls.ROUTER: {
        ("topic", WORK, "Read"),  # a dead group's pending shards moved (health.Rescuer)
        ("group", topics.worker_consumer_group("default"), "Read"),  # ...by joining its group
        ("topic", topics.HEARTBEATS, "Write"),  # tombstones of forgotten workers
    },
    acls.WORKER: {("topic", WORK, "Create")},  # a worker of a new group makes its work topic
    acls.AGGREGATOR: set(),
    acls.PRODUCER: set(),
}


def granted(principal: str) -> set[tuple[str, str, str]]:
    """The grants of `principal`, instantiated on the concrete names (prefixes on the
    default group's work topic and group, and on the base topics)."""
    names = {"topic": [*BASE, WORK], "group": [topics.worker_consumer_group("default")]}
    names["group"] += [g.name for g in acls.grants() if g.resource == "group" and not g.prefixed]
    names["group"] += [f"{topics.ROUTER_GROUP}"]
    return {
        (resource, name, op)
        for resource, candidates in names.items()
        for name in candidates
        for op in ("Read", "Write", "Create", "Describe")
        if acls.allows(principal, resource, name, op)  # type: ignore[arg-type]
    }


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_subscription_and_publish_of_a_service_is_granted_to_its_principal(service: str) -> None:
    principal = SERVICES[service]
    assert subscriptions(service), f"no subscriber found in evalstream.{service}.app"
    missing = needs(service) - granted(principal)
    assert not missing, f"{principal} lacks {sorted(missing)}"


def beyond_needs(service: str) -> set[tuple[str, str, str]]:
    """What the service's principal is granted that its code does not use (the extras aside)."""
    principal = SERVICES[service]
    extras = EXTRAS[principal] | {
        (r, n, "Describe") for r, n, op in EXTRAS[principal] if op in ("Read", "Write")
    }
    return granted(principal) - needs(service) - extras


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_is_granted_nothing_beyond_its_needs_and_the_documented_extras(service: str) -> None:
    extra = beyond_needs(service)
    assert not extra, f"{SERVICES[service]} has grants its code does not use: {sorted(extra)}"


def test_a_describe_only_grant_beyond_the_needs_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    table = acls.grants()
    planted = acls.Grant(acls.WORKER, "topic", topics.JOBS, "Describe")
    monkeypatch.setattr(acls, "grants", lambda: (*table, planted))
    assert beyond_needs("worker") == {("topic", topics.JOBS, "Describe")}
    group = acls.Grant(acls.PRODUCER, "group", topics.ROUTER_GROUP, "Describe")
    monkeypatch.setattr(acls, "grants", lambda: (*table, group))
    assert beyond_needs("producer") == {("group", topics.ROUTER_GROUP, "Describe")}


def test_the_issues_promises_hold() -> None:
    assert not acls.allows(acls.PRODUCER, "topic", topics.RESULTS, "Write")
    assert not acls.allows(acls.WORKER, "topic", topics.JOBS, "Write")
    writers_of_jobs = {p for p in acls.PRINCIPALS if acls.allows(p, "topic", topics.JOBS, "Write")}
    assert writers_of_jobs == {acls.USER}
    # users publish jobs and control requests, read heartbeats, and see lag: nothing else
    assert not acls.allows(acls.USER, "topic", topics.RESULTS, "Write")
    assert not acls.allows(acls.USER, "topic", WORK, "Read")
    assert acls.allows(acls.USER, "topic", WORK, "Describe")  # evalctl workers: lag
    assert acls.allows(acls.USER, "group", topics.worker_consumer_group("default"), "Describe")
    assert not acls.allows(acls.USER, "group", topics.worker_consumer_group("default"), "Read")
    # results are written by workers only, read by the aggregator only
    assert {p for p in acls.PRINCIPALS if acls.allows(p, "topic", topics.RESULTS, "Write")} == {acls.WORKER}
    assert {p for p in acls.PRINCIPALS if acls.allows(p, "topic", topics.RESULTS, "Read")} == {
        acls.AGGREGATOR
    }
    # the admin is the super user and has no ACLs of its own
    assert acls.ADMIN not in {g.principal for g in acls.grants()}


def test_no_grant_reaches_beyond_the_pipelines_names() -> None:
    known = (*BASE, topics.WORK_PREFIX)
    groups = (
        topics.WORKER_GROUP_PREFIX,
        topics.ROUTER_GROUP,
        topics.RETRY_GROUP,
        topics.PRODUCER_GROUP,
    )
    for g in acls.grants():
        assert g.name, g  # an empty prefix would match every name
        if g.resource == "topic":
            assert g.name in known, g
        else:
            assert g.name.startswith(groups) or g.name.startswith(topics.AGGREGATOR_GROUP), g


def test_the_table_follows_the_topic_prefix() -> None:
    """A second pipeline on one broker (KAFKA_TOPIC_PREFIX) gets grants on its own names only."""
    code = "from evalstream.common import acls; print('\\n'.join(g.name for g in acls.grants()))"
    env = {**os.environ, "KAFKA_TOPIC_PREFIX": "team2."}
    names = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    lines = names.stdout.split()
    assert lines and all(n.startswith("team2.") for n in lines), lines
    assert len(lines) == len(acls.grants())


def test_only_this_pipelines_names_are_pruned() -> None:
    """apply() deletes stray bindings on its own names only: bootstrapping a second pipeline
    (KAFKA_TOPIC_PREFIX) must not strip the first one's ACLs, nor the first the second's."""
    code = (
        "from evalstream.common import acls; names = ['eval.jobs', 'evalstream-producer', "
        "'team2.eval.jobs', 'team2.evalstream-worker-x', 'other', 'team2.other']; "
        "print(' '.join(n for n in names if acls.in_this_pipeline(n)))"
    )
    ours = {}
    for prefix in ("", "team2."):
        env = {**os.environ, "KAFKA_TOPIC_PREFIX": prefix}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        ours[prefix] = out.stdout.split()
    assert ours[""] == ["eval.jobs", "evalstream-producer"]
    assert ours["team2."] == ["team2.eval.jobs", "team2.evalstream-worker-x"]
