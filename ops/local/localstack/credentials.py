"""The stack's credentials, made on first use in <stack>/secrets (mode 700, files 600) and
reused afterwards, so that a stack keeps them across `up` and `down`: a random password per
Kafka principal (acls.py names them), one per PostgreSQL role (the owner, `evalstream`, and a
role per component, db_roles.py), a key pair per S3 identity (s3_identities.py), and
SeaweedFS's own signing keys and certificates (seaweed.py)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import quote

from evalstream.common import db_roles, s3_identities
from evalstream.common.acls import ADMIN, PRINCIPALS
from localstack.config import KAFKA_PORT, PG_PORT, PROM_PORT, S3_PORT, STACK

KAFKA_PRINCIPALS = (ADMIN, *PRINCIPALS)
__all__ = [
    "ADMIN",
    "CREDENTIAL_VARIABLES",
    "KAFKA_MECHANISM",
    "KAFKA_PRINCIPALS",
    "database_url",
    "kafka_env",
    "kafka_password",
    "pg_password",
    "pg_role_passwords",
    "s3_env",
    "s3_keys",
]
KAFKA_MECHANISM = "SCRAM-SHA-512"
PG_USER = PG_DB = "evalstream"  # the owner of the tables (bootstrap, migrations)
# The settings that carry a principal's credentials: a process started with other values of
# these runs as someone else (stack.py restarts it).
CREDENTIAL_VARIABLES = ("KAFKA_USERNAME", "KAFKA_PASSWORD", "DATABASE_URL", "S3_ACCESS_KEY", "S3_SECRET_KEY")


def secrets_folder() -> Path:
    folder = STACK / "secrets"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def secret(name: str, nbytes: int = 24) -> str:
    """The secret stored as <stack>/secrets/<name>, made (random, `nbytes` bytes as hex) on
    first use."""
    path = STACK / "secrets" / name
    secrets_folder()
    if not path.exists():
        # O_EXCL: two processes making it at once keep one secret, never half of each
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(nbytes))
    return path.read_text().strip()


def _known(principal: str) -> None:
    if principal not in KAFKA_PRINCIPALS:
        raise SystemExit(f"[stack] no principal {principal!r}; known: {', '.join(KAFKA_PRINCIPALS)}")


def kafka_password(principal: str) -> str:
    _known(principal)
    return secret(f"kafka-{principal}.password")


def kafka_env(principal: str) -> dict[str, str]:
    """The settings (libs/common settings.KafkaSettings) of a client acting as `principal`."""
    return {
        "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": KAFKA_MECHANISM,
        "KAFKA_USERNAME": principal,
        "KAFKA_PASSWORD": kafka_password(principal),
    }


def pg_password(role: str = PG_USER) -> str:
    return secret(f"postgres-{role}.password")


def pg_role_passwords() -> dict[str, str]:
    """component -> the password of its database role (db_roles.SERVICES)."""
    return {s: pg_password(db_roles.role_name(PG_USER, s)) for s in db_roles.SERVICES}


def database_url(port: int, principal: str = ADMIN) -> str:
    """DATABASE_URL of `principal`: the admin's is the owner's, a component's its own role's;
    empty for one without a role (the router)."""
    _known(principal)
    if principal == ADMIN:
        role = PG_USER
    elif principal in db_roles.SERVICES:
        role = db_roles.role_name(PG_USER, principal)
    else:
        return ""
    return f"postgresql://{role}:{quote(pg_password(role), safe='')}@127.0.0.1:{port}/{PG_DB}"


def s3_keys(principal: str) -> tuple[str, str]:
    """(access key, secret key) of `principal`'s S3 identity (s3_identities.PRINCIPALS)."""
    if principal not in s3_identities.PRINCIPALS:
        raise SystemExit(
            f"[stack] {principal!r} has no S3 identity; they are {', '.join(s3_identities.PRINCIPALS)}"
        )
    return secret(f"s3-{principal}.access-key", 10), secret(f"s3-{principal}.secret-key")


def s3_env(principal: str) -> dict[str, str]:
    """S3_ACCESS_KEY and S3_SECRET_KEY of `principal`; empty for one without an S3 identity
    (router, worker), so that it inherits no one else's."""
    _known(principal)
    access, secret_key = s3_keys(principal) if principal in s3_identities.PRINCIPALS else ("", "")
    return {"S3_ACCESS_KEY": access, "S3_SECRET_KEY": secret_key}


def client_env(principal: str = "user") -> dict[str, str]:
    """How a client acting as `principal` (acls.py: a service's name, "user" for evalctl and
    tests, "admin") reaches this stack (the settings' names), with that principal's
    credentials: its Kafka principal, its database role (db_roles.py; the admin's is the
    tables' owner; none for the router) and its S3 key pair (s3_identities.py; none for the
    router and workers). Credentials a principal lacks are empty, never someone else's."""
    return {
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{KAFKA_PORT}",
        **kafka_env(principal),
        "DATABASE_URL": database_url(PG_PORT, principal),
        "S3_ENDPOINT": f"http://127.0.0.1:{S3_PORT}",
        **s3_env(principal),
        "PROMETHEUS_URL": f"http://127.0.0.1:{PROM_PORT}",
        "EVALSTREAM_STACK": str(STACK),
    }
