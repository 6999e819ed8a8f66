"""The local stack's hosts' network (`stack.py up --hosts N`): the configuration it adds to
Kafka and PostgreSQL, and the endpoints a host's processes get. Pure: nothing is started."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ops" / "local"))

from localstack import hosts  # noqa: E402
from localstack.config import KAFKA_HOSTS_PORT, KAFKA_PROXIED_PORT, PROXY_KAFKA_PORT  # noqa: E402
from localstack.kafka import add_host_listeners  # noqa: E402
from localstack.postgres import HOSTS_TAG, allow_hosts_network  # noqa: E402

PLAIN = """\
process.roles=broker,controller
listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://127.0.0.1:9092
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
"""


def _props(path: Path) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln)


def test_kafka_gets_a_hosts_listener_and_one_advertised_at_the_proxy(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(PLAIN)
    add_host_listeners(path)
    props = _props(path)
    gateway = hosts.gateway()
    assert props["listeners"].split(",") == [
        "PLAINTEXT://127.0.0.1:9092",
        "CONTROLLER://127.0.0.1:9093",
        f"HOSTS://{gateway}:{KAFKA_HOSTS_PORT}",
        f"PROXIED://127.0.0.1:{KAFKA_PROXIED_PORT}",
    ]
    # hosts are told the hosts' address; clients behind the proxy the proxy's, never loopback
    assert props["advertised.listeners"].split(",") == [
        "PLAINTEXT://127.0.0.1:9092",
        f"HOSTS://{gateway}:{KAFKA_HOSTS_PORT}",
        f"PROXIED://{gateway}:{PROXY_KAFKA_PORT}",
    ]
    protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
    assert protocols == {
        "PLAINTEXT": "PLAINTEXT",
        "CONTROLLER": "PLAINTEXT",
        "HOSTS": "PLAINTEXT",
        "PROXIED": "PLAINTEXT",
    }
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["controller.listener.names"] == "CONTROLLER"


def test_kafka_host_listeners_take_the_main_listeners_protocol_and_settings(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text(
        PLAIN.replace("PLAINTEXT://127.0.0.1:9092", "CLIENT://127.0.0.1:9092")
        .replace("PLAINTEXT:PLAINTEXT,CONTROLLER", "CLIENT:SASL_PLAINTEXT,CONTROLLER")
        .replace("inter.broker.listener.name=PLAINTEXT", "inter.broker.listener.name=CLIENT")
        + "listener.name.client.scram-sha-512.sasl.jaas.config=ScramLoginModule required;\n"
    )
    add_host_listeners(path)
    props = _props(path)
    protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
    assert protocols["HOSTS"] == protocols["PROXIED"] == "SASL_PLAINTEXT"
    for name in ("client", "hosts", "proxied"):
        key = f"listener.name.{name}.scram-sha-512.sasl.jaas.config"
        assert props[key] == "ScramLoginModule required;", key


def test_postgres_admits_the_hosts_network_with_the_loopback_method_and_forgets_it(tmp_path: Path) -> None:
    hba = tmp_path / "pg_hba.conf"
    original = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 trust\n"
    hba.write_text(original)
    allow_hosts_network(hba, "10.231.46.0/24")
    allow_hosts_network(hba, "10.231.46.0/24")  # idempotent: a restart adds no second rule
    added = [ln for ln in hba.read_text().splitlines() if ln.endswith(HOSTS_TAG)]
    assert added == [f"host all all 10.231.46.0/24 scram-sha-256  {HOSTS_TAG}"]
    allow_hosts_network(hba, None)
    assert hba.read_text() == original


def test_hosts_have_private_addresses_and_short_interface_names() -> None:
    net = hosts.subnet()
    assert net.is_private and net.prefixlen == 24
    machines = hosts.hosts(12)
    assert len({h.address for h in machines} | {hosts.gateway()}) == 13
    assert all(h.address.startswith(str(net.network_address)[:-1]) for h in machines)
    for name in [hosts.bridge(), *(h.veth for h in machines)]:
        assert len(name) <= 15, name  # Linux's limit for interface names
    assert len({h.netns for h in machines}) == 12


def test_a_hosts_processes_reach_every_endpoint_at_the_infrastructures_address() -> None:
    spec = importlib.util.spec_from_file_location("evalstream_local_stack_hosts", ROOT / "ops/local/stack.py")
    assert spec and spec.loader
    stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack)
    base = stack.client_env()
    env = stack.host_client_env()
    gateway = hosts.gateway()
    assert env["KAFKA_BOOTSTRAP"] == f"{gateway}:{KAFKA_HOSTS_PORT}"
    assert stack.host_client_env(via_proxy=True)["KAFKA_BOOTSTRAP"] == f"{gateway}:{PROXY_KAFKA_PORT}"
    for key in ("DATABASE_URL", "S3_ENDPOINT"):
        before, after = urlsplit(base[key]), urlsplit(env[key])
        assert after.hostname == gateway and after.port == before.port, key
        assert (after.username, after.password, after.path) == (before.username, before.password, before.path)
    assert not any("127.0.0.1" in v for v in env.values()), env
