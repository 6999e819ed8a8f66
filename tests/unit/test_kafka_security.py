"""The one helper that turns KAFKA_SECURITY_PROTOCOL / KAFKA_SASL_MECHANISM / KAFKA_USERNAME /
KAFKA_PASSWORD into client settings (kafka_security.py), and the redaction of passwords in
printed text (redact.py, logs.JsonFormatter)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from faststream.security import SASLPlaintext, SASLScram256, SASLScram512

from evalstream.common.kafka_security import (
    KafkaSecurityError,
    broker_security,
    client_kwargs,
    java_properties,
)
from evalstream.common.logs import JsonFormatter
from evalstream.common.redact import redact, redact_url
from evalstream.common.settings import KafkaSettings, Settings

SASL = {
    "KAFKA_BOOTSTRAP": "kafka:19092",
    "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "KAFKA_USERNAME": "worker",
    "KAFKA_PASSWORD": 's3cr"et',
}


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    settings = KafkaSettings.from_env({})
    assert settings.kafka_security_protocol == "PLAINTEXT"
    assert client_kwargs(settings) == {"bootstrap_servers": "127.0.0.1:9092"}
    assert broker_security(settings) is None
    assert java_properties(settings) == ""


def test_sasl_plaintext_with_scram_512_by_default() -> None:
    settings = KafkaSettings.from_env(SASL)
    assert client_kwargs(settings) == {
        "bootstrap_servers": "kafka:19092",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "worker",
        "sasl_plain_password": 's3cr"et',
    }
    security = broker_security(settings)
    assert isinstance(security, SASLScram512) and not security.use_ssl
    assert (security.username, security.password) == ("worker", 's3cr"et')


@pytest.mark.parametrize(
    ("mechanism", "cls"),
    [("SCRAM-SHA-256", SASLScram256), ("PLAIN", SASLPlaintext), ("scram-sha-512", SASLScram512)],
)
def test_sasl_ssl_and_other_mechanisms(mechanism: str, cls: type) -> None:
    settings = KafkaSettings.from_env(
        {**SASL, "KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": mechanism}
    )
    kwargs = client_kwargs(settings)
    assert kwargs["security_protocol"] == "SASL_SSL" and kwargs["sasl_mechanism"] == mechanism.upper()
    assert kwargs["ssl_context"] is not None
    security = broker_security(settings)
    assert security is not None and isinstance(security, cls)
    assert security.use_ssl and security.ssl_context is not None


def test_java_properties_for_kafkas_tools_quote_the_password() -> None:
    text = java_properties(KafkaSettings.from_env(SASL))
    assert "security.protocol=SASL_PLAINTEXT\n" in text
    assert "sasl.mechanism=SCRAM-SHA-512\n" in text
    assert 'ScramLoginModule required username="worker" password="s3cr\\"et";' in text


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SSL"}, "KAFKA_SECURITY_PROTOCOL"),
        ({**SASL, "KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM"),
        ({**SASL, "KAFKA_PASSWORD": ""}, "KAFKA_PASSWORD"),
        ({**SASL, "KAFKA_USERNAME": ""}, "KAFKA_USERNAME"),
    ],
)
def test_inconsistent_settings_are_refused_naming_the_variable(env: dict[str, str], named: str) -> None:
    settings = KafkaSettings.from_env(env)
    for build in (client_kwargs, broker_security, java_properties):
        with pytest.raises(KafkaSecurityError, match=named):
            build(settings)


def test_settings_repr_holds_no_password() -> None:
    settings = Settings.from_env(
        {
            **SASL,
            "DATABASE_URL": "postgresql://evalstream:pg-pass-123@db:5432/evalstream",
            "S3_SECRET_KEY": "s3-key-9",
        }
    )
    text = repr(settings)
    for secret in ('s3cr"et', "pg-pass-123", "s3-key-9"):
        assert secret not in text
    assert "kafka_username='worker'" in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://evalstream:abc123@127.0.0.1:5432/db", "postgresql://evalstream:***@127.0.0.1:5432/db"),
        ("cannot reach postgresql://u:p%40x@h/d: refused", "cannot reach postgresql://u:***@h/d: refused"),
        ("host=db password=hunter2 user=x", "host=db password=*** user=x"),
        (
            'PlainLoginModule required username="a" password="b c";',
            'PlainLoginModule required username="a" password=***;',
        ),
        ("http://host:8080/a@b and no secret", "http://host:8080/a@b and no secret"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_redact_url_keeps_a_url_without_password() -> None:
    assert redact_url("postgresql://evalstream@db/x") == "postgresql://evalstream@db/x"
    assert redact_url("postgresql://evalstream:pw@db/x") == "postgresql://evalstream:***@db/x"


def test_log_lines_carry_no_database_password() -> None:
    url = "postgresql://evalstream:pg-pass-123@db:5432/evalstream"
    try:
        raise ConnectionError(f"cannot connect to {url}")
    except ConnectionError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "pool for %s failed", (url,), None)
        record.exc_info = sys.exc_info()
    line = JsonFormatter("worker").format(record)
    entry = json.loads(line)
    assert "pg-pass-123" not in line
    assert entry["msg"] == "pool for postgresql://evalstream:***@db:5432/evalstream failed"
    assert "postgresql://evalstream:***@db" in entry["exc"]
