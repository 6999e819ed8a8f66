"""docker-compose.yml's variables and ports agree with settings.py, .env.example and the local
stack (ops/local/stack.py): the variable names and defaults, each service's credentials (its
database role and S3 key pair, all from .env), the ports, published on loopback only, and
Kafka's listeners."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from evalstream.common.settings import DEFAULTS, SERVICE_PORTS
from tests.unit.compose_files import (
    APP_SERVICES,
    COMPOSE,
    ENV,
    ENV_EXAMPLE,
    INTERPOLATION,
    RAW,
    ROOT,
    STACK_OFFSET,
    environment,
    published_ports,
    stack,
)

# compose service -> whose credentials it runs with (acls.py, db_roles.py, s3_identities.py):
# bootstrap is the admin (the tables' owner, the store's admin)
PRINCIPALS = {"producer": "producer", "router": "router", "worker": "worker", "aggregator": "aggregator",
              "bootstrap": "admin"}  # fmt: skip


# Environment variables the infrastructure images read (not evalstream settings): each image's own
# documented names.
INFRA_ENV = {
    "kafka": lambda k: k.startswith("KAFKA_") or k == "CLUSTER_ID",
    # the image's own, and the components' roles' passwords (ops/docker/postgres/roles.sh)
    "postgres": lambda k: (
        k in {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD"}
        or re.fullmatch(r"POSTGRES_ROLE_[A-Z]+_PASSWORD", k) is not None
    ),
    # the admin's keys (the image's), SeaweedFS's signing keys, the components' key pairs and
    # buckets for the identity file (ops/docker/s3/start.sh)
    "s3": lambda k: (
        k in {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_BUCKET_DATASETS", "S3_BUCKET_RESULTS"}
        or re.fullmatch(r"WEED_JWT_(FILER_)?SIGNING(_READ)?_KEY|S3_[A-Z]+_(ACCESS|SECRET)_KEY", k) is not None
    ),
    "prometheus": lambda k: False,
    "grafana": lambda k: k.startswith("GF_"),
}
SECRET_ENV = re.compile(r"PASSWORD|SECRET|ACCESS_KEY")


# --------------------------------------------------------------------------- compose: variables


def test_services_set_only_settings_variables() -> None:
    from evalstream.common.providers import PRESETS

    provider_keys = {preset.key_env for preset in PRESETS.values()}  # the worker's API keys
    for name in APP_SERVICES:
        unknown = set(environment(COMPOSE["services"][name])) - set(DEFAULTS)
        if name == "worker":
            unknown -= provider_keys
        assert not unknown, f"{name} sets variables settings.py does not read: {sorted(unknown)}"
    for name, allowed in INFRA_ENV.items():
        unknown = {k for k in environment(COMPOSE["services"][name]) if not allowed(k)}
        assert not unknown, f"{name}: undocumented variables {sorted(unknown)}"


def test_services_reach_the_infrastructure_by_compose_names() -> None:
    for name in APP_SERVICES:
        env = environment(COMPOSE["services"][name])
        assert env["KAFKA_BOOTSTRAP"] == "kafka:19092", name
        if "DATABASE_URL" in env:
            url = urlsplit(env["DATABASE_URL"])
            assert (url.scheme, url.hostname, url.port, url.path) == (
                "postgresql",
                "postgres",
                5432,
                "/" + ENV["POSTGRES_DB"],
            ), name
        if "S3_ENDPOINT" in env:
            assert env["S3_ENDPOINT"] == "http://s3:8333", name


def test_each_service_has_its_own_database_role_and_s3_key_pair() -> None:
    """Each service connects as its principal's role (db_roles.role_name; bootstrap as the
    owner) and with its principal's key pair (the admin's for bootstrap); the router has
    neither, workers no key pair."""
    from evalstream.common import db_roles, s3_identities

    owner = ENV["POSTGRES_USER"]
    for name, principal in PRINCIPALS.items():
        env = environment(COMPOSE["services"][name])
        if principal in db_roles.SERVICES or principal == "admin":
            url = urlsplit(env["DATABASE_URL"])
            if principal == "admin":
                assert (url.username, url.password) == (owner, ENV["POSTGRES_PASSWORD"]), name
            else:
                role, password = (
                    db_roles.role_name(owner, principal),
                    ENV[f"POSTGRES_ROLE_{principal.upper()}_PASSWORD"],
                )
                assert (url.username, url.password) == (role, password), name
        else:
            assert "DATABASE_URL" not in env, f"{name} has a database role"
        if principal in s3_identities.PRINCIPALS:
            keys = (env["S3_ACCESS_KEY"], env["S3_SECRET_KEY"])
            assert keys == (
                ENV[f"S3_{principal.upper()}_ACCESS_KEY"],
                ENV[f"S3_{principal.upper()}_SECRET_KEY"],
            ), name
        else:
            assert not {"S3_ACCESS_KEY", "S3_SECRET_KEY"} & set(env), f"{name} has S3 keys"
    # no two principals share a password or a key
    secrets = [v for k, v in ENV.items() if SECRET_ENV.search(k) or k.startswith("SEAWEEDFS_JWT_")]
    assert len(secrets) == len(set(secrets))
    # The producer, the bootstrap and the aggregator need both stores; workers the database.
    for name in ("producer", "bootstrap", "aggregator"):
        assert {"DATABASE_URL", "S3_ENDPOINT"} <= set(environment(COMPOSE["services"][name])), name
    assert "DATABASE_URL" in environment(COMPOSE["services"]["worker"])


def test_postgres_makes_every_components_role() -> None:
    """ops/docker/postgres/roles.sh makes the roles db_roles.py names, with the passwords the
    services' DATABASE_URLs carry, and the healthcheck waits for them."""
    from evalstream.common import db_roles

    postgres = COMPOSE["services"]["postgres"]
    assert postgres["command"] == ["bash", "/opt/evalstream/roles.sh"]
    mounts = dict(str(v).split(":")[:2][::-1] for v in postgres["volumes"])
    script = (ROOT / mounts["/opt/evalstream/roles.sh"]).read_text()
    loop = re.search(r"for component in ([a-z ]+); do", script)
    assert loop and loop.group(1).split() == list(db_roles.SERVICES)
    assert 'role="${POSTGRES_USER}_${component}"' in script  # db_roles.role_name
    assert 'var="POSTGRES_ROLE_${component^^}_PASSWORD"' in script
    for component in db_roles.SERVICES:
        assert f"POSTGRES_ROLE_{component.upper()}_PASSWORD" in environment(postgres)
    assert "max_connections=200" in script
    assert "test -f /tmp/roles-ready" in " ".join(postgres["healthcheck"]["test"])


def test_the_s3_identity_file_is_the_identity_table() -> None:
    """ops/s3/s3.compose.json, rendered as ops/docker/s3/start.sh renders it, is
    s3_identities.config() for the key pairs and buckets of .env."""
    from evalstream.common import s3_identities
    from evalstream.common.settings import S3Settings

    s3 = COMPOSE["services"]["s3"]
    env = environment(s3)
    text = (ROOT / "ops/s3/s3.compose.json").read_text()
    script = (ROOT / "ops/docker/s3/start.sh").read_text()
    placeholders = set(re.findall(r"\$\{(\w+)\}", text))
    assert placeholders <= set(re.findall(r"\b(S3_[A-Z_]+)\b", script.split("; do", 1)[0]))
    rendered = json.loads(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text))
    keys = {
        p: (ENV[f"S3_{p.upper()}_ACCESS_KEY"], ENV[f"S3_{p.upper()}_SECRET_KEY"])
        for p in s3_identities.PRINCIPALS
        if p != "admin"
    }
    buckets = S3Settings(
        s3_bucket_datasets=ENV["S3_BUCKET_DATASETS"], s3_bucket_results=ENV["S3_BUCKET_RESULTS"]
    )
    assert rendered == s3_identities.config(keys, buckets)
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        ENV["S3_ADMIN_ACCESS_KEY"],
        ENV["S3_ADMIN_SECRET_KEY"],
    )
    assert s3["entrypoint"] == ["/bin/sh", "/opt/evalstream/s3-start.sh"]
    for flag in (
        "-disableHttp",
        "-s3.config=/tmp/s3.json",
        "-s3.iam=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ):
        assert flag in s3["command"], flag
    for key in ("WEED_JWT_SIGNING_KEY", "WEED_JWT_SIGNING_READ_KEY", "WEED_JWT_FILER_SIGNING_KEY"):
        assert env[key], key


def test_http_ports_equal_settings_service_ports() -> None:
    for name, svc in APP_SERVICES.items():
        if name == "bootstrap":
            continue
        env = environment(COMPOSE["services"][name])
        assert env["HTTP_HOST"] == "0.0.0.0", name
        assert int(env["HTTP_PORT"]) == SERVICE_PORTS[svc], name
        for _ip, published, target in published_ports(COMPOSE["services"][name]):
            assert published == target == SERVICE_PORTS[svc], name


def test_compose_defaults_equal_settings_defaults() -> None:
    """A `${X:-default}` for a settings variable X repeats settings.py's default."""
    for name in APP_SERVICES:
        for key, value in (RAW["services"][name].get("environment") or {}).items():
            m = re.fullmatch(r"\$\{(\w+):-([^}]*)\}", str(value))
            if m and m.group(1) == key and key in DEFAULTS:
                assert m.group(2) == DEFAULTS[key], f"{name}: {key} defaults to {m.group(2)!r}"


def test_env_example_declares_every_variable_compose_needs_and_no_other() -> None:
    assert "cp .env.example .env" in ENV_EXAMPLE.read_text()
    missing = INTERPOLATION.required - set(ENV)
    assert not missing, f".env.example lacks {sorted(missing)}"
    unused = set(ENV) - INTERPOLATION.required - INTERPOLATION.optional
    assert not unused, f".env.example sets variables docker-compose.yml does not use: {sorted(unused)}"


def test_env_example_takes_none_of_the_settings_default_credentials() -> None:
    """A stack made from .env.example refuses settings.py's defaults (the documented
    evalstream/evalstream and evalstream/evalstream-secret): a client that names no credentials
    gets nowhere. Its other settings equal the local defaults."""
    url = urlsplit(DEFAULTS["DATABASE_URL"])
    passwords = {v for k, v in ENV.items() if k.endswith("PASSWORD")}
    s3_keys = {v for k, v in ENV.items() if re.fullmatch(r"S3_[A-Z]+_(ACCESS|SECRET)_KEY", k)}
    assert len(passwords) >= 11 and len(s3_keys) == 8
    assert url.password not in passwords
    assert not {DEFAULTS["S3_ACCESS_KEY"], DEFAULTS["S3_SECRET_KEY"]} & s3_keys
    for key in set(ENV) & set(DEFAULTS):
        assert ENV[key] == DEFAULTS[key], key
    assert (ENV["POSTGRES_USER"], "/" + ENV["POSTGRES_DB"]) == (url.username, url.path)


def test_credentials_come_only_from_env() -> None:
    for name, svc in RAW["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            value = str(value)
            if SECRET_ENV.search(key) and not key.startswith("KAFKA_"):
                from_env = re.fullmatch(r"\$\{\w+(:?\?[^}]*)?\}", value)
                assert from_env, f"{name}: {key} must be ${{VAR}} from .env"
            if key == "DATABASE_URL":
                assert (
                    re.search(r"\$\{POSTGRES_(ROLE_[A-Z]+_)?PASSWORD", value) and "${POSTGRES_USER" in value
                ), name
    identities = json.loads((ROOT / "ops/s3/s3.compose.json").read_text())["identities"]
    for identity in identities:
        for credential in identity["credentials"]:
            assert all(
                re.fullmatch(r"\$\{S3_[A-Z]+_(ACCESS|SECRET)_KEY\}", v) for v in credential.values()
            ), "S3 keys belong in .env, not in ops/s3/s3.compose.json"


# --------------------------------------------------------------------------- compose: ports


def test_no_port_is_published_beyond_loopback() -> None:
    for name, svc in COMPOSE["services"].items():
        assert svc.get("network_mode") != "host", name
        for host_ip, published, target in published_ports(svc):
            assert host_ip == "127.0.0.1", f"{name}: port {target} is published on all interfaces"
            assert published, f"{name}: port {target} is published on a random host port"


def test_infrastructure_ports_equal_the_local_stack() -> None:
    def single(name: str) -> int:
        ports = published_ports(COMPOSE["services"][name])
        assert len(ports) == 1, name
        return ports[0][1]

    kafka, pg, s3, prom = (
        p - STACK_OFFSET for p in (stack.KAFKA_PORT, stack.PG_PORT, stack.S3_PORT, stack.PROM_PORT)
    )
    assert single("kafka") == kafka == int(DEFAULTS["KAFKA_BOOTSTRAP"].rsplit(":", 1)[1])
    assert single("postgres") == pg == urlsplit(DEFAULTS["DATABASE_URL"]).port
    assert single("s3") == s3 == urlsplit(DEFAULTS["S3_ENDPOINT"]).port
    assert single("prometheus") == prom
    for name in ("kafka", "postgres", "s3", "prometheus"):
        ((_ip, published, target),) = published_ports(COMPOSE["services"][name])
        assert published == target, name


def test_kafka_is_kraft_with_an_internal_and_a_loopback_listener() -> None:
    kafka = COMPOSE["services"]["kafka"]
    image, _, tag = kafka["image"].partition(":")
    major, minor = (int(x) for x in tag.split(".")[:2])
    assert image == "apache/kafka" and major == 4 and minor >= 1, kafka["image"]
    env = environment(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert sorted(advertised.values()) == ["127.0.0.1:9092", "kafka:19092"]
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    assert set(listeners) == {*advertised, "CONTROLLER"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_DEFAULT_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
    ):
        assert env[key] == "1", key
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    assert "/opt/kafka/bin/kafka-broker-api-versions.sh" in " ".join(kafka["healthcheck"]["test"])


def test_infrastructure_images() -> None:
    images = {
        name: COMPOSE["services"][name]["image"] for name in ("postgres", "s3", "prometheus", "grafana")
    }
    assert re.fullmatch(r"postgres:1[67](\..*)?", images["postgres"]), images
    assert images["s3"].startswith("chrislusf/seaweedfs:"), images
    assert images["prometheus"].startswith("prom/prometheus:"), images
    assert images["grafana"].startswith("grafana/grafana:"), images
    s3_command = COMPOSE["services"]["s3"]["command"]
    assert s3_command[0] == "server" and "-s3" in s3_command and "-s3.port=8333" in s3_command
