"""The stack's credentials: a random password per Kafka principal (acls.py names them) and
one for PostgreSQL's evalstream role, made on first use in <stack>/secrets (mode 700, files
600) and reused afterwards, so that a stack keeps its passwords across `up` and `down`."""

from __future__ import annotations

import os
import secrets
from urllib.parse import quote

from evalstream.common.acls import ADMIN, PRINCIPALS
from localstack.config import STACK

KAFKA_PRINCIPALS = (ADMIN, *PRINCIPALS)
__all__ = [
    "ADMIN",
    "KAFKA_MECHANISM",
    "KAFKA_PRINCIPALS",
    "database_url",
    "kafka_env",
    "kafka_password",
    "pg_password",
]
KAFKA_MECHANISM = "SCRAM-SHA-512"
PG_USER = PG_DB = "evalstream"


def secret(name: str) -> str:
    """The password stored as <stack>/secrets/<name>, made (random, 192 bits) on first use."""
    folder = STACK / "secrets"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / name
    if not path.exists():
        # O_EXCL: two processes making it at once keep one password, never half of each
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(24))
    return path.read_text().strip()


def kafka_password(principal: str) -> str:
    if principal not in KAFKA_PRINCIPALS:
        raise SystemExit(f"[stack] no Kafka principal {principal!r}; known: {', '.join(KAFKA_PRINCIPALS)}")
    return secret(f"kafka-{principal}.password")


def kafka_env(principal: str) -> dict[str, str]:
    """The settings (libs/common settings.KafkaSettings) of a client acting as `principal`."""
    return {
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": KAFKA_MECHANISM,
        "KAFKA_USERNAME": principal,
        "KAFKA_PASSWORD": kafka_password(principal),
    }


def pg_password() -> str:
    return secret("postgres-evalstream.password")


def database_url(port: int) -> str:
    return f"postgresql://{PG_USER}:{quote(pg_password(), safe='')}@127.0.0.1:{port}/{PG_DB}"
