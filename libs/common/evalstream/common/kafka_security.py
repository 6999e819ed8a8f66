"""How every Kafka client of the project authenticates: the one place that turns the
KAFKA_SECURITY_PROTOCOL / KAFKA_SASL_MECHANISM / KAFKA_USERNAME / KAFKA_PASSWORD settings
into FastStream broker security, aiokafka client arguments, or a Java client properties
file (Kafka's own command-line tools).

    python -m evalstream.common.kafka_security properties   # client.properties for Kafka's tools
"""

from __future__ import annotations

import argparse
import ssl
from typing import TYPE_CHECKING, Any

from evalstream.common.settings import KafkaSettings

if TYPE_CHECKING:  # FastStream is loaded only where a broker is made
    from faststream.security import BaseSecurity

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
_JAAS_MODULES = {
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}


class KafkaSecurityError(ValueError):
    """The security settings are inconsistent (the message names the variable)."""


def _checked(settings: KafkaSettings) -> tuple[str, str]:
    """The protocol and mechanism, upper case; ValueError naming the variable that is wrong."""
    protocol = settings.kafka_security_protocol.strip().upper() or "PLAINTEXT"
    mechanism = settings.kafka_sasl_mechanism.strip().upper()
    if protocol not in PROTOCOLS:
        raise KafkaSecurityError(
            f"KAFKA_SECURITY_PROTOCOL={settings.kafka_security_protocol!r}: expected one of {', '.join(PROTOCOLS)}"
        )
    if protocol == "PLAINTEXT":
        return protocol, mechanism
    if mechanism not in MECHANISMS:
        raise KafkaSecurityError(
            f"KAFKA_SASL_MECHANISM={settings.kafka_sasl_mechanism!r}: expected one of {', '.join(MECHANISMS)}"
        )
    if not settings.kafka_username or not settings.kafka_password:
        raise KafkaSecurityError(
            f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_USERNAME and KAFKA_PASSWORD "
            '(on the local stack: eval "$(ops/local/stack.py env)")'
        )
    return protocol, mechanism


def _ssl_context(settings: KafkaSettings) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=settings.kafka_ssl_cafile or None)


def broker_security(settings: KafkaSettings) -> BaseSecurity | None:
    """`security=` of a FastStream KafkaBroker (None: PLAINTEXT). FastStream is imported
    here: the clients that do not use it (evalctl, bootstrap) never load it."""
    from faststream.security import SASLPlaintext, SASLScram256, SASLScram512

    protocol, mechanism = _checked(settings)
    if protocol == "PLAINTEXT":
        return None
    use_ssl = protocol == "SASL_SSL"
    kinds = {"SCRAM-SHA-512": SASLScram512, "SCRAM-SHA-256": SASLScram256, "PLAIN": SASLPlaintext}
    return kinds[mechanism](
        settings.kafka_username,
        settings.kafka_password,
        ssl_context=_ssl_context(settings) if use_ssl else None,
        use_ssl=use_ssl,
    )


def client_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments of any aiokafka client (producer, consumer, admin): the bootstrap
    servers and, unless PLAINTEXT, the SASL settings."""
    protocol, mechanism = _checked(settings)
    kwargs: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap}
    if protocol == "PLAINTEXT":
        return kwargs
    kwargs.update(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_plain_username=settings.kafka_username,
        sasl_plain_password=settings.kafka_password,
    )
    if protocol == "SASL_SSL":
        kwargs["ssl_context"] = _ssl_context(settings)
    return kwargs


def _java_quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def java_properties(settings: KafkaSettings) -> str:
    """The same settings as a Java client properties file (`--command-config` of Kafka's
    tools); empty for PLAINTEXT."""
    protocol, mechanism = _checked(settings)
    if protocol == "PLAINTEXT":
        return ""
    lines = [
        f"security.protocol={protocol}",
        f"sasl.mechanism={mechanism}",
        f"sasl.jaas.config={_JAAS_MODULES[mechanism]} required "
        f'username="{_java_quoted(settings.kafka_username)}" password="{_java_quoted(settings.kafka_password)}";',
    ]
    if protocol == "SASL_SSL" and settings.kafka_ssl_cafile:
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={settings.kafka_ssl_cafile}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "what", choices=["properties"], help="properties: a Java client properties file on stdout"
    )
    ap.parse_args()
    print(java_properties(KafkaSettings.from_env()), end="")


if __name__ == "__main__":
    main()
