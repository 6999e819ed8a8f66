"""Who may do what on the broker: one principal per service, one for the users (evalctl and
any client that publishes jobs) and the admin, with the ACLs each gets, derived from the
topic and group names of topics.py (KAFKA_TOPIC_PREFIX included). `grants()` is the one
table; `apply()` makes the broker's ACLs of these principals equal to it (bootstrap runs it
with the admin principal). The admin is the broker's only super user and has no ACLs.

    python -m evalstream.common.acls            # print the table
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from evalstream.common import topics

ADMIN = "admin"
PRODUCER, ROUTER, WORKER, AGGREGATOR, USER = "producer", "router", "worker", "aggregator", "user"
# Principals with ACLs (the admin has none: it is the super user). Every service's
# KAFKA_USERNAME is its name here; evalctl and job publishers use USER.
SERVICE_PRINCIPALS = (PRODUCER, ROUTER, WORKER, AGGREGATOR)
PRINCIPALS = (*SERVICE_PRINCIPALS, USER)

Resource = Literal["topic", "group"]
Operation = Literal["Read", "Write", "Create", "Describe"]


@dataclass(frozen=True, order=True)
class Grant:
    """ALLOW `operation` on a topic or consumer group, by exact name or by name prefix."""

    principal: str
    resource: Resource
    name: str
    operation: Operation
    prefixed: bool = False

    def __str__(self) -> str:
        pattern = f"{self.name}*" if self.prefixed else self.name
        return f"User:{self.principal:<11} {self.operation:<8} {self.resource:<5} {pattern}"


def _topic(principal: str, ops: str, name: str, *, prefixed: bool = False) -> list[Grant]:
    return [Grant(principal, "topic", name, op, prefixed) for op in ops.split()]  # type: ignore[arg-type]


def _group(principal: str, name: str, *, op: Operation = "Read", prefixed: bool = False) -> Grant:
    return Grant(principal, "group", name, op, prefixed)


def grants() -> tuple[Grant, ...]:
    """The table. Read on a topic or group implies Describe; Write on a topic implies
    Describe and idempotent writes. Every service may dead-letter what it cannot decode."""
    work, worker_groups = topics.WORK_PREFIX, topics.WORKER_GROUP_PREFIX
    table = [
        # producer: jobs in, shards out
        *_topic(PRODUCER, "Read", topics.JOBS),
        _group(PRODUCER, topics.PRODUCER_GROUP),
        *_topic(PRODUCER, "Write", topics.SHARDS),
        *_topic(PRODUCER, "Write", topics.DLQ),
        # router: shards and due retries in, work out; heartbeats read (and tombstoned);
        # the worker groups' lag read, and a dead group's pending shards moved by joining it
        # (prefixed: also the inputs ROUTER_SHARDS_TOPIC / ROUTER_RETRY_TOPIC may name,
        # eval.shards.<x> and eval.retry.<x>)
        *_topic(ROUTER, "Read", topics.SHARDS, prefixed=True),
        *_topic(ROUTER, "Read Write", topics.RETRY, prefixed=True),
        _group(ROUTER, topics.ROUTER_GROUP, prefixed=True),  # and <group>.<topic> of extra inputs
        _group(ROUTER, topics.RETRY_GROUP),
        *_topic(ROUTER, "Read Write", topics.HEARTBEATS),
        *_topic(ROUTER, "Read Write", work, prefixed=True),
        _group(ROUTER, worker_groups, prefixed=True),
        *_topic(ROUTER, "Write", topics.DLQ),
        # worker: its work topic in (created by the worker of a new group), results,
        # retries, dead letters and heartbeats out
        *_topic(WORKER, "Read Create", work, prefixed=True),
        _group(WORKER, worker_groups, prefixed=True),
        *_topic(WORKER, "Write", topics.RESULTS),
        *_topic(WORKER, "Write", topics.RETRY),
        *_topic(WORKER, "Write", topics.DLQ),
        *_topic(WORKER, "Write", topics.HEARTBEATS),
        # aggregator: results, dead letters and control requests in; redriven shards out
        *_topic(AGGREGATOR, "Read", topics.RESULTS),
        *_topic(AGGREGATOR, "Read Write", topics.DLQ),
        *_topic(AGGREGATOR, "Read", topics.CONTROL),
        _group(AGGREGATOR, topics.AGGREGATOR_GROUP),
        _group(AGGREGATOR, topics.AGGREGATOR_DLQ_GROUP),
        _group(AGGREGATOR, topics.AGGREGATOR_CONTROL_GROUP),
        *_topic(AGGREGATOR, "Write", topics.SHARDS),
        # users (evalctl, any job publisher): jobs and control requests out; the fleet's
        # heartbeats read, and the worker groups' lag (Describe: offsets, not messages)
        *_topic(USER, "Write", topics.JOBS),
        *_topic(USER, "Write", topics.CONTROL),
        *_topic(USER, "Read", topics.HEARTBEATS),
        *_topic(USER, "Describe", work, prefixed=True),
        _group(USER, worker_groups, op="Describe", prefixed=True),
    ]
    return tuple(sorted(set(table)))


# What an ACL for an operation also allows (Kafka's implication rules).
_IMPLIED: dict[str, set[str]] = {"Read": {"Describe"}, "Write": {"Describe"}}


def allows(principal: str, resource: Resource, name: str, operation: Operation) -> bool:
    """Whether the table lets `principal` do `operation` on the topic or group `name`."""
    return principal == ADMIN or any(
        g.principal == principal
        and g.resource == resource
        and (name.startswith(g.name) if g.prefixed else name == g.name)
        and (g.operation == operation or operation in _IMPLIED.get(g.operation, ()))
        for g in grants()
    )


# Kafka's wire codes (org.apache.kafka.common.resource / acl).
_RESOURCE = {"topic": 2, "group": 3}
_PATTERN = {False: 3, True: 4}  # LITERAL, PREFIXED
_OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8}
_ANY, _ALLOW = 1, 3


def _grant_of(
    resource_type: int, name: str, pattern: int, principal: str, host: str, op: int, perm: int
) -> Grant | None:
    """A broker binding as a Grant, or None when it is not of the kind the table holds."""
    resource = {v: k for k, v in _RESOURCE.items()}.get(resource_type)
    operation = {v: k for k, v in _OPERATION.items()}.get(op)
    prefixed = {v: k for k, v in _PATTERN.items()}.get(pattern)
    if resource is None or operation is None or prefixed is None or host != "*" or perm != _ALLOW:
        return None
    return Grant(principal.removeprefix("User:"), resource, name, operation, prefixed)  # type: ignore[arg-type]


def in_this_pipeline(name: str) -> bool:
    """Whether a topic or group name is one of this pipeline's (KAFKA_TOPIC_PREFIX): another
    pipeline on the same broker, under another prefix, keeps its bindings."""
    rest = name.removeprefix(topics.PREFIX) if name.startswith(topics.PREFIX) else None
    return rest is not None and rest.startswith(("eval.", "evalstream-"))


def _binding(g: Grant) -> tuple[int, str, int, str, str, int, int]:
    """A grant as the broker's ACL binding fields (resource type, name, pattern, principal,
    host, operation, permission)."""
    return (
        _RESOURCE[g.resource],
        g.name,
        _PATTERN[g.prefixed],
        f"User:{g.principal}",
        "*",
        _OPERATION[g.operation],
        _ALLOW,
    )


async def apply(admin: Any) -> tuple[list[Grant], list[Grant]]:
    """Makes the broker's ACLs of PRINCIPALS on this pipeline's names equal to the table,
    through a started AIOKafkaAdminClient of the admin principal; returns (created, deleted).
    Bindings of other principals, and on other pipelines' names, are left alone."""
    from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest

    async def send(request: Any) -> Any:
        response = await admin._send_request(request)
        errors = [
            (code, message)
            for code, message, *_ in getattr(response, "creation_responses", None)
            or getattr(response, "filter_responses", None)
            or [(response.error_code, response.error_message)]
            if code
        ]
        if errors:
            raise RuntimeError(f"{type(request).__name__} refused by the broker: {errors}")
        return response

    described = await send(DescribeAclsRequest(_ANY, None, _ANY, None, None, _ANY, _ANY))
    ours = {f"User:{p}" for p in PRINCIPALS}
    present: set[Grant] = set()
    stray: list[tuple[int, str, int, str, str, int, int]] = []
    for resource_type, name, pattern, acls in described.resources:
        for principal, host, op, perm in acls:
            if principal not in ours or not in_this_pipeline(name):
                continue
            grant = _grant_of(resource_type, name, pattern, principal, host, op, perm)
            if grant is None:
                stray.append((resource_type, name, pattern, principal, host, op, perm))
            else:
                present.add(grant)
    wanted = set(grants())
    created = sorted(wanted - present)
    deleted = sorted(present - wanted)
    for g in created:
        await send(CreateAclsRequest(*_binding(g)))
    stray += [_binding(g) for g in deleted]
    for binding in stray:
        await send(DeleteAclsRequest(*binding))
    return created, deleted


def main() -> None:
    print("\n".join(str(g) for g in grants()))


if __name__ == "__main__":
    main()
