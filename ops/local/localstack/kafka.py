"""The Kafka broker (KRaft, single node): its configuration, storage format and health."""

from __future__ import annotations

import subprocess
from pathlib import Path

from localstack import hosts
from localstack.config import (
    KAFKA_CONTROLLER_PORT,
    KAFKA_HOSTS_PORT,
    KAFKA_PORT,
    KAFKA_PROXIED_PORT,
    PROXY_KAFKA_PORT,
    STACK,
    port_open,
    run,
)
from localstack.installs import kafka_libs


def kafka_prepare() -> None:
    d = STACK / "kafka"
    d.mkdir(parents=True, exist_ok=True)
    (d / "server.properties").write_text(f"""\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{KAFKA_CONTROLLER_PORT}
listeners=PLAINTEXT://127.0.0.1:{KAFKA_PORT},CONTROLLER://127.0.0.1:{KAFKA_CONTROLLER_PORT}
advertised.listeners=PLAINTEXT://127.0.0.1:{KAFKA_PORT}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={d / "data"}
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
        add_host_listeners(d / "server.properties")
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
""")
    if not (d / "data" / "meta.properties").exists():
        cp = f"{kafka_libs()}/*"
        cluster_id = run(
            ["java", "-cp", cp, "kafka.tools.StorageTool", "random-uuid"], stdout=subprocess.PIPE
        ).stdout.strip()
        run(
            [
                "java",
                "-cp",
                cp,
                f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(d / "server.properties"),
            ],
            stdout=subprocess.DEVNULL,
        )


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
