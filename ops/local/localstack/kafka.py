"""The Kafka broker (KRaft, single node): its configuration (SASL on every listener, ACLs
enforced), storage format (with the SCRAM users) and health."""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

from localstack import hosts
from localstack.config import (
    KAFKA_CONTROLLER_PORT,
    KAFKA_HOSTS_PORT,
    KAFKA_PORT,
    KAFKA_PROXIED_PORT,
    PROXY_KAFKA_PORT,
    STACK,
    log,
    port_open,
    run,
)
from localstack.credentials import ADMIN, KAFKA_MECHANISM, KAFKA_PRINCIPALS, kafka_password
from localstack.installs import kafka_libs


def listeners() -> dict[str, tuple[str, int]]:
    """The broker's listeners: name -> (host, port). CLIENT serves every client (and the
    broker's own inter-broker traffic), CONTROLLER the KRaft quorum. `up --hosts N` adds the
    hosts' listeners (add_host_listeners), which copy CLIENT's SASL settings."""
    return {"CLIENT": ("127.0.0.1", KAFKA_PORT), "CONTROLLER": ("127.0.0.1", KAFKA_CONTROLLER_PORT)}


def _jaas(module: str, user: str, password: str, *, accept: bool = False) -> str:
    server_side = f' user_{user}="{password}"' if accept else ""
    return f'{module} required username="{user}" password="{password}"{server_side};'


def security_config() -> str:
    """Listeners and their security. Every listener takes SASL: clients SCRAM-SHA-512 with
    the credentials stored in the cluster's metadata (made at format time), the controller
    listener PLAIN with the admin's password only (KRaft cannot check SCRAM there, since the
    credentials live in the metadata the controller serves). Nobody unauthenticated gets a
    principal, and the admin is the only super user; everyone else has the ACLs of acls.py."""
    admin = kafka_password(ADMIN)
    names = listeners()
    clients = [n for n in names if n != "CONTROLLER"]
    lines = [
        "listeners=" + ",".join(f"{n}://{h}:{p}" for n, (h, p) in names.items()),
        "advertised.listeners=" + ",".join(f"{n}://{names[n][0]}:{names[n][1]}" for n in clients),
        "listener.security.protocol.map=" + ",".join(f"{n}:SASL_PLAINTEXT" for n in names),
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=CLIENT",
        f"sasl.enabled.mechanisms={KAFKA_MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={KAFKA_MECHANISM}",
        "sasl.mechanism.controller.protocol=PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        "listener.name.controller.plain.sasl.jaas.config="
        + _jaas("org.apache.kafka.common.security.plain.PlainLoginModule", ADMIN, admin, accept=True),
        *(
            f"listener.name.{n.lower()}.{KAFKA_MECHANISM.lower()}.sasl.jaas.config="
            + _jaas("org.apache.kafka.common.security.scram.ScramLoginModule", ADMIN, admin)
            for n in clients
        ),
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN}",
        "allow.everyone.if.no.acl.found=false",
    ]
    return "\n".join(lines) + "\n"


def _scram_fingerprint() -> str:
    """What the storage was formatted with: a hash of the quorum's form and of every
    principal and its password. (A storage formatted with --standalone lost its SCRAM
    credentials at the broker's first restart: the local stack uses static voters.)"""
    text = "controller.quorum.voters\n" + "".join(f"{p}={kafka_password(p)}\n" for p in KAFKA_PRINCIPALS)
    return hashlib.sha256(text.encode()).hexdigest()


def kafka_config_current() -> bool:
    """Whether the broker's storage and configuration are this stack's SASL/SCRAM ones (a
    broker started before authentication came in must be restarted by `up`)."""
    d = STACK / "kafka"
    marker, config = d / "scram.sha256", d / "server.properties"
    text = config.read_text() if config.exists() else ""
    return (
        marker.exists()
        and marker.read_text().strip() == _scram_fingerprint()
        and f"super.users=User:{ADMIN}" in text
        and _jaas(
            "org.apache.kafka.common.security.plain.PlainLoginModule",
            ADMIN,
            kafka_password(ADMIN),
            accept=True,
        )
        in text
    )


def kafka_prepare() -> None:
    d = STACK / "kafka"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)  # server.properties holds the admin's password
    config = d / "server.properties"
    config.touch(mode=0o600)
    config.chmod(0o600)
    config.write_text(f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{KAFKA_CONTROLLER_PORT}
{security_config()}log.dirs={d / "data"}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=168
""")
    if hosts.configured():
        add_host_listeners(config)  # they copy the CLIENT listener's SASL settings
    (d / "log4j2.properties").write_text("""\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
""")
    marker = d / "scram.sha256"
    fingerprint = _scram_fingerprint()
    if (d / "data" / "meta.properties").exists():
        if marker.exists() and marker.read_text().strip() == fingerprint:
            return
        # Formatted before authentication came in (or with other passwords): SCRAM users
        # can only be added at format time, so the broker's storage is formatted again. The
        # old log is kept aside, never deleted; PostgreSQL and S3 keep their data.
        aside = d / f"data-before-scram-{time.strftime('%Y%m%d-%H%M%S')}"
        (d / "data").rename(aside)
        log(
            f"Kafka's storage had no SCRAM users for this stack's passwords: formatting it again "
            f"(topics are re-created; runs in flight in the old log will not finish). Old log kept in "
            f"{aside} - delete it when you no longer need it."
        )
    cp = f"{kafka_libs()}/*"
    cluster_id = run(
        ["java", "-cp", cp, "kafka.tools.StorageTool", "random-uuid"], stdout=subprocess.PIPE
    ).stdout.strip()
    scram = [
        arg
        for p in KAFKA_PRINCIPALS
        for arg in ("--add-scram", f"{KAFKA_MECHANISM}=[name={p},password={kafka_password(p)}]")
    ]
    run(
        [
            "java",
            "-cp",
            cp,
            f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(config),
            *scram,
        ],
        stdout=subprocess.DEVNULL,
    )
    marker.write_text(fingerprint + "\n")


def kafka_argv() -> list[str]:
    d = STACK / "kafka"
    return [
        "java",
        "-Xms256m",
        "-Xmx768m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
        "-cp",
        f"{kafka_libs()}/*",
        "kafka.Kafka",
        str(d / "server.properties"),
    ]


def kafka_healthy() -> bool:
    log_text = (
        (STACK / "logs" / "kafka.log").read_text(errors="replace")
        if (STACK / "logs/kafka.log").exists()
        else ""
    )
    return (port_open(KAFKA_PORT) and "Kafka Server started" in log_text.rsplit("Starting", 1)[-1]) or (
        port_open(KAFKA_PORT) and "started" in log_text[-4000:]
    )


# --------------------------------------------------------------------------- the hosts' listeners


def add_host_listeners(properties: Path) -> None:
    """Two more client listeners for `up --hosts N` (localstack/hosts.py), with the security
    protocol and per-listener settings of the main client listener, whatever they are:

    * HOSTS on the hosts' network address, advertised as itself: what hosts bootstrap from;
    * PROXIED on loopback, advertised as the fault proxy's address (Toxiproxy on the hosts'
      network, forwarding to it), so that a client that bootstraps through the proxy is
      told to keep using the proxy for every connection.
    """
    lines = properties.read_text().splitlines()
    props = {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in lines if "=" in ln)}
    controllers = set(props.get("controller.listener.names", "").split(","))
    listeners = [x.strip() for x in props["listeners"].split(",")]
    # the main client listener: the one on the stack's Kafka port (else the first broker one)
    brokers = [x.split("://", 1)[0] for x in listeners if x.split("://", 1)[0] not in controllers]
    on_port = [x.split("://", 1)[0] for x in listeners if x.endswith(f":{KAFKA_PORT}")]
    client = (on_port or brokers)[0]
    protocols = dict(p.split(":", 1) for p in props.get("listener.security.protocol.map", "").split(",") if p)
    protocol = protocols.get(client, client)  # without a map a listener is named by its protocol
    added = {
        "HOSTS": (f"{hosts.gateway()}:{KAFKA_HOSTS_PORT}", f"{hosts.gateway()}:{KAFKA_HOSTS_PORT}"),
        "PROXIED": (f"127.0.0.1:{KAFKA_PROXIED_PORT}", f"{hosts.gateway()}:{PROXY_KAFKA_PORT}"),
    }
    protocols = {client: protocol, **protocols, **dict.fromkeys(added, protocol)}
    advertised = props.get("advertised.listeners", props["listeners"])
    values = {
        "listeners": ",".join([*listeners, *(f"{n}://{bind}" for n, (bind, _) in added.items())]),
        "advertised.listeners": ",".join([advertised, *(f"{n}://{adv}" for n, (_, adv) in added.items())]),
        "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
    }
    out = [ln for ln in lines if ln.partition("=")[0].strip() not in values]
    out += [f"{k}={v}" for k, v in values.items()]
    prefix = f"listener.name.{client.lower()}."  # e.g. the SASL mechanisms' JAAS settings
    for ln in lines:
        if ln.startswith(prefix):
            out += [f"listener.name.{n.lower()}.{ln.removeprefix(prefix)}" for n in added]
    properties.write_text("\n".join(out) + "\n")
