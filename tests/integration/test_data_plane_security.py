"""The data plane authenticates and authorises, on the real stack: Kafka refuses clients
without credentials or with a wrong password, its controller listener takes nobody but the
admin, each principal can do what the ACL table (acls.py) grants and is refused the rest;
PostgreSQL refuses connections without the password; no password reaches a repr, a log or
evalctl's output."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.conn import create_conn
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.admin import DescribeAclsRequest
from aiokafka.protocol.metadata import MetadataRequest

from evalstream.common import acls, topics
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.settings import KafkaSettings, Settings
from tests.support import ROOT, STACK, principal_settings, read_topic_since, topic_end_offsets

pytestmark = pytest.mark.stack


@pytest.fixture(autouse=True)
def authenticating_broker(stack: Settings) -> None:
    """These tests are about a broker that authenticates (the local stack's): run them there."""
    assert stack.kafka_security_protocol != "PLAINTEXT", (
        "KAFKA_SECURITY_PROTOCOL is PLAINTEXT: run against the local stack with "
        'eval "$(ops/local/stack.py env)" (its broker authenticates; the testcontainers one does not)'
    )


WORK = topics.work_topic("default")  # the stack's default group (stack.py up)
FORGED = b"forged by test_data_plane_security"


async def metadata(settings: KafkaSettings, port: int | None = None, **override: str) -> None:
    """One connection, authenticated as `settings` say (raises when refused), and a request
    on it: metadata, or on the controller listener (`port`), which serves no metadata, the
    list of ACLs."""
    kwargs = client_kwargs(settings) | override
    host, default_port = kwargs.pop("bootstrap_servers").rsplit(":", 1)
    conn = await create_conn(host, port or int(default_port), **kwargs)
    try:
        await conn.send(
            MetadataRequest([]) if port is None else DescribeAclsRequest(1, None, 1, None, None, 1, 1)
        )
    finally:
        conn.close()


# --------------------------------------------------------------------------- authentication


async def test_a_client_without_credentials_is_refused(stack: Settings) -> None:
    await metadata(stack)  # the same broker takes the users' principal
    plaintext = dataclasses.replace(stack, kafka_security_protocol="PLAINTEXT")
    with pytest.raises(KafkaConnectionError):
        await metadata(plaintext)
    producer = AIOKafkaProducer(**client_kwargs(plaintext), request_timeout_ms=5000)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()


@pytest.mark.parametrize("principal", [acls.USER, acls.WORKER, acls.ADMIN])
async def test_a_wrong_password_is_refused(stack: Settings, principal: str) -> None:
    settings = principal_settings(principal)
    await metadata(settings)
    with pytest.raises(SaslAuthenticationFailed):
        await metadata(dataclasses.replace(settings, kafka_password=settings.kafka_password + "x"))
    with pytest.raises(SaslAuthenticationFailed):
        await metadata(dataclasses.replace(settings, kafka_username="nobody"))


async def test_the_controller_listener_takes_only_the_admin(stack: Settings) -> None:
    """KRaft's controller listener (the local stack's: the client port + 1) would make an
    unauthenticated client a super user if it took one: it takes SASL/PLAIN from the admin only."""
    controller = int(stack.kafka_bootstrap.rsplit(":", 1)[1]) + 1
    admin = principal_settings(acls.ADMIN)
    await metadata(admin, controller, sasl_mechanism="PLAIN")
    with pytest.raises(KafkaConnectionError):
        await metadata(dataclasses.replace(admin, kafka_security_protocol="PLAINTEXT"), controller)
    for principal in (acls.USER, acls.WORKER):
        with pytest.raises(SaslAuthenticationFailed):
            await metadata(principal_settings(principal), controller, sasl_mechanism="PLAIN")
    with pytest.raises(UnsupportedSaslMechanismError):  # SCRAM is not offered there at all
        await metadata(admin, controller)


# --------------------------------------------------------------------------- authorisation


async def refused_writes(settings: KafkaSettings, names: list[str]) -> dict[str, bool]:
    """topic -> whether a write to it was refused (nothing is written to one that is not)."""
    out = {}
    producer = AIOKafkaProducer(**client_kwargs(settings), request_timeout_ms=10_000)
    await producer.start()
    try:
        for name in names:
            try:
                # only ever tried where the table denies it: an allowed write would land
                await producer.send_and_wait(name, FORGED)
                out[name] = False
            except TopicAuthorizationFailedError:
                out[name] = True
    finally:
        await producer.stop()
    return out


async def refused_reads(settings: KafkaSettings, names: list[str]) -> dict[str, bool]:
    """topic -> whether reading its first partition was refused: the broker's metadata
    withholds the topic (the principal may not even describe it), or the fetch fails. A
    consumer per topic: one that was refused once stays refused."""
    out = {}
    for name in names:
        consumer = AIOKafkaConsumer(
            **client_kwargs(settings), enable_auto_commit=False, request_timeout_ms=10_000
        )
        await consumer.start()
        try:
            if name not in (await consumer._client.fetch_all_metadata()).topics():
                out[name] = True
                continue
            consumer.assign([TopicPartition(name, 0)])
            await consumer.seek_to_beginning()
            await consumer.getmany(timeout_ms=1000)
            out[name] = False
        except TopicAuthorizationFailedError:
            out[name] = True
        finally:
            await consumer.stop()
    return out


@pytest.mark.parametrize("principal", acls.PRINCIPALS)
async def test_each_principal_is_refused_every_write_the_table_does_not_grant(
    stack: Settings, principal: str
) -> None:
    everything = [*(t.name for t in topics.BASE_TOPICS), WORK]
    denied = [t for t in everything if not acls.allows(principal, "topic", t, "Write")]
    assert denied  # every principal is refused something
    before = {t: await topic_end_offsets(t) for t in denied}
    refused = await refused_writes(principal_settings(principal), denied)
    assert refused == dict.fromkeys(denied, True)
    landed = [t for t in denied for _, value, _ in await read_topic_since(t, before[t]) if value == FORGED]
    assert landed == []


@pytest.mark.parametrize("principal", acls.PRINCIPALS)
async def test_each_principal_reads_what_the_table_grants_and_nothing_else(
    stack: Settings, principal: str
) -> None:
    everything = [*(t.name for t in topics.BASE_TOPICS), WORK]
    refused = await refused_reads(principal_settings(principal), everything)
    expected = {t: not acls.allows(principal, "topic", t, "Read") for t in everything}
    assert refused == expected


async def test_the_named_promises_of_the_issue(stack: Settings) -> None:
    """The producer cannot write results; users cannot write results nor read work; a
    worker can neither publish nor take jobs."""
    assert await refused_writes(principal_settings(acls.PRODUCER), [topics.RESULTS]) == {topics.RESULTS: True}
    assert await refused_writes(stack, [topics.RESULTS]) == {topics.RESULTS: True}  # stack: the users'
    assert await refused_reads(stack, [WORK]) == {WORK: True}
    worker = principal_settings(acls.WORKER)
    assert await refused_writes(worker, [topics.JOBS]) == {topics.JOBS: True}
    assert await refused_reads(worker, [topics.JOBS]) == {topics.JOBS: True}


async def test_a_principal_cannot_join_another_services_consumer_group(stack: Settings) -> None:
    """A worker that could join the aggregator's group would take results from it."""
    consumer = AIOKafkaConsumer(
        topics.WORK_PREFIX + "default",
        **client_kwargs(principal_settings(acls.WORKER)),
        group_id=topics.AGGREGATOR_GROUP,
        enable_auto_commit=False,
        request_timeout_ms=10_000,
    )
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            await consumer.start()  # joining the group is refused
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- PostgreSQL


def without_password(url: str, password: str | None = None, user: str | None = None) -> str:
    parts = urlsplit(url)
    userinfo = f"{user or parts.username}" + (f":{password}" if password is not None else "")
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.hostname}:{parts.port}"))


async def test_postgres_refuses_a_connection_without_the_password(stack: Settings) -> None:
    conn = await asyncpg.connect(stack.database_url)  # the stack's URL carries it
    await conn.close()
    bare = without_password(stack.database_url)
    assert urlsplit(bare).password is None
    owner = urlsplit(principal_settings(acls.ADMIN).database_url)
    for url in (
        bare,
        without_password(stack.database_url, "evalstream"),  # the old fixed password
        without_password(stack.database_url, "wrong"),
        without_password(stack.database_url, user="postgres"),  # the superuser, over TCP
        # the owner's name with the users' password
        without_password(stack.database_url, urlsplit(stack.database_url).password, user=owner.username),
    ):
        with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
            await asyncpg.connect(url, password="" if urlsplit(url).password is None else None)


# --------------------------------------------------------------------------- no password printed


def secrets_of_the_stack() -> list[str]:
    """Every password and key of the stack: Kafka's, every database role's, every S3 key
    pair's, SeaweedFS's signing keys (files of <stack>/secrets; its seaweedfs folder holds
    configuration made of these and the certificates)."""
    folder = STACK / "secrets"
    found = [p.read_text().strip() for p in sorted(folder.iterdir()) if p.is_file()]
    assert len(found) >= 6 + 5 + 8 + 4, f"expected every principal's password and keys in {folder}"
    return found


def test_settings_repr_shows_no_password(stack: Settings) -> None:
    for settings in (stack, principal_settings(acls.ADMIN), principal_settings(acls.AGGREGATOR)):
        db_password = urlsplit(settings.database_url).password
        assert db_password and settings.kafka_password and settings.s3_secret_key
        text = repr(settings) + str(settings)
        assert db_password not in text
        assert settings.kafka_password not in text
        assert settings.s3_secret_key not in text
        assert "kafka_username=" in text  # the repr still says who the client is


def test_no_log_of_the_stack_holds_a_password(stack: Settings) -> None:
    logs = sorted((STACK / "logs").glob("*.log"))
    assert any(p.name.startswith("worker-") for p in logs) and len(logs) >= 7
    secrets = secrets_of_the_stack()
    leaks = [(p.name, i) for p in logs for i, s in enumerate(secrets) if s in p.read_text(errors="replace")]
    assert leaks == []


def test_evalctl_errors_show_no_password(stack: Settings, tmp_path: Path) -> None:
    """A DATABASE_URL that cannot be reached: the error names the problem, not the password."""
    db_password = urlsplit(stack.database_url).password
    assert db_password
    closed = urlsplit(stack.database_url)._replace(netloc=f"evalstream:{db_password}@127.0.0.1:1")
    proc = subprocess.run(
        [sys.executable, "-m", "evalstream.cli.main", "status", "run-x"],
        env={**os.environ, "DATABASE_URL": urlunsplit(closed)},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Error" in proc.stderr + proc.stdout, proc.stderr
    assert db_password not in proc.stdout + proc.stderr
    assert stack.kafka_password not in proc.stdout + proc.stderr
