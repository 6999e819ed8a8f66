"""Who may do what in PostgreSQL: one role per component that uses the database, with only
the privileges its SQL needs, and the owner, which owns the tables, runs the migrations and is
never handed to a service or a user.

The roles are named after the owner: `<owner>_producer`, `<owner>_aggregator`,
`<owner>_worker` and `<owner>_user` (evalctl and anyone else who reads results); the router
uses no database. `grants()` is the one table; `apply()` makes the privileges of these roles
on the schema's tables and sequences equal to it, as the owner, at every bootstrap (after the
migrations), so that a table or column a later migration adds is covered the moment it
exists: a table's privileges cover every column, present and future, and a grant on "every
column but ..." is recomputed from the table's columns each time. A table the table below
does not name is the owner's alone (`unclassified()` lists such tables, and a unit test refuses
a migration that creates one without deciding who may touch it).

Making the roles (LOGIN, password) is the job of whoever holds the passwords and may create
roles: the local stack (ops/local/localstack/postgres.py, as the postgres superuser) and
compose's postgres container (ops/docker/postgres/roles.sh). `apply()` creates a missing role
without LOGIN when the owner may create roles (so that its grants exist), else says it is
missing.

    python -m evalstream.common.db_roles            # print the table
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from evalstream.common.acls import AGGREGATOR, PRODUCER, ROUTER, USER, WORKER

# Components with a database role of their own (the router has none: it uses no database).
SERVICES = (PRODUCER, AGGREGATOR, WORKER, USER)
NO_DATABASE = (ROUTER,)

Kind = Literal["table", "sequence"]
Privilege = Literal["SELECT", "INSERT", "UPDATE", "DELETE", "USAGE"]

# Every table of the schema, and what it holds (the table of grants below says who may touch
# it). A migration that creates a table must add it here (tests/unit/test_db_roles.py).
TABLES: dict[str, str] = {
    "runs": "one row per run: the job, its manifest, progress and summary",
    "item_results": "one row per item of a run: the answer, its grading, what served it",
    "dead_letters": "eval.dlq's records, with the message that failed (payload)",
    "answer_cache": "greedy answers by (model, weights, parameters, prompt), shared by all runs",
    "dataset_versions": "dataset contents by hash, with the names they were submitted as",
    "schema_migrations": "which migrations ran: the owner's alone",
}
SEQUENCES: dict[str, str] = {"dead_letters_id_seq": "dead_letters.id (bigserial)"}


@dataclass(frozen=True, order=True)
class Grant:
    """`privilege` on a table or sequence for a component's role; `except_columns`: on
    every column of the table but these (a column grant, recomputed at every apply)."""

    service: str
    relation: str
    privilege: Privilege
    kind: Kind = "table"
    except_columns: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        what = (
            f"{self.relation} (every column but {', '.join(self.except_columns)})"
            if self.except_columns
            else self.relation
        )
        return f"{self.service:<11} {self.privilege:<7} {self.kind:<8} {what}"


def _table(service: str, privileges: str, relation: str) -> list[Grant]:
    return [Grant(service, relation, p) for p in privileges.split()]  # type: ignore[arg-type]


def grants() -> tuple[Grant, ...]:
    """The table. SELECT is granted wherever a statement reads a table (a WHERE clause, ON
    CONFLICT, RETURNING), INSERT and UPDATE where the component's code writes; nobody but the
    owner deletes, creates or alters anything."""
    table = [
        # producer: the run it takes in (validating -> rejected | running, the manifest) and
        # the dataset version it stores
        *_table(PRODUCER, "SELECT INSERT UPDATE", "runs"),
        *_table(PRODUCER, "SELECT INSERT UPDATE", "dataset_versions"),
        # aggregator: results, dead letters (recorded, redriven), runs' progress, completion,
        # summary, regrade runs; its report and item pages read runs and results
        *_table(AGGREGATOR, "SELECT INSERT UPDATE", "runs"),
        *_table(AGGREGATOR, "SELECT INSERT UPDATE", "item_results"),
        *_table(AGGREGATOR, "SELECT INSERT UPDATE", "dead_letters"),
        Grant(AGGREGATOR, "dead_letters_id_seq", "USAGE", "sequence"),
        # worker: the answer cache
        *_table(WORKER, "SELECT INSERT", "answer_cache"),
        # users (evalctl): read runs, results, dataset versions and dead letters, but not a dead
        # letter's payload (the work message that failed: another run's items, which a user may
        # not read off eval.work either), nor the answer cache
        *_table(USER, "SELECT", "runs"),
        *_table(USER, "SELECT", "item_results"),
        *_table(USER, "SELECT", "dataset_versions"),
        Grant(USER, "dead_letters", "SELECT", except_columns=("payload",)),
    ]
    return tuple(sorted(set(table)))


def allows(service: str, relation: str, privilege: str, column: str | None = None) -> bool:
    """Whether the table lets `service` do `privilege` on `relation` (on `column`, if given;
    a column grant allows a statement that reads only granted columns)."""
    return any(
        g.service == service
        and g.relation == relation
        and g.privilege == privilege
        and not (g.except_columns and (column is None or column in g.except_columns))
        for g in grants()
    )


def role_name(owner: str, service: str) -> str:
    """The role of a component in a database whose tables `owner` owns."""
    if service not in SERVICES:
        raise ValueError(f"no database role for {service!r}; components with one: {', '.join(SERVICES)}")
    return f"{owner}_{service}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# --------------------------------------------------------------------------- roles (superuser)

# Session advisory locks serialise the migrations and the aggregators' sink (sink.SinkLock): a
# role that could take one could stall every aggregator. PUBLIC may call these functions by
# default; only a superuser can change that (they belong to pg_catalog).
_ADVISORY_LOCKS = (
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
    "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared",
)
ADVISORY_LOCK_FUNCTIONS = tuple(
    f"pg_catalog.{name}({args})" for name in _ADVISORY_LOCKS for args in ("bigint", "integer, integer")
)
# Stays everyone's: it releases the calling session's own locks only, and asyncpg's pool calls
# it whenever it takes a connection back.
UNLOCK_ALL = "pg_catalog.pg_advisory_unlock_all()"
# Who keeps them: the owner (migrations) and the aggregator (its sink's lock).
ADVISORY_LOCK_HOLDERS = (AGGREGATOR,)
# Who may create temporary tables (visible to its own session only, gone with it): the
# aggregator, which COPYs each window's rows into one before upserting them (store.py).
TEMP_TABLE_HOLDERS = (AGGREGATOR,)


def login_roles_sql(owner: str, passwords: Mapping[str, str]) -> str:
    """SQL (for psql or any client, as a role that may create roles) that makes each
    component's role (`passwords`: component -> password) a LOGIN role with that password and
    no other attribute; idempotent. The passwords are in the text: send it on stdin, never on
    a command line."""
    lines = ["SET password_encryption = 'scram-sha-256';"]
    for service, password in passwords.items():
        role = role_name(owner, service)
        lines += [
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {quote_literal(role)}) "
            f"THEN CREATE ROLE {quote_ident(role)}; END IF; END $$;",
            f"ALTER ROLE {quote_ident(role)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
            f"NOBYPASSRLS PASSWORD {quote_literal(password)};",
        ]
    return "\n".join(lines) + "\n"


def superuser_sql(owner: str, database: str) -> str:
    """What only a superuser can do for least privilege, run in `database`: advisory locks
    for the owner and the aggregator only. Idempotent."""
    functions = ", ".join(ADVISORY_LOCK_FUNCTIONS)
    holders = ", ".join(
        quote_ident(r) for r in [owner, *(role_name(owner, s) for s in ADVISORY_LOCK_HOLDERS)]
    )
    return (
        f"REVOKE EXECUTE ON FUNCTION {functions} FROM PUBLIC;\n"
        f"GRANT EXECUTE ON FUNCTION {functions} TO {holders};\n"
        f"GRANT EXECUTE ON FUNCTION {UNLOCK_ALL} TO PUBLIC;\n"
    )


# --------------------------------------------------------------------------- apply (owner)


@dataclass
class Changes:
    granted: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    created_roles: list[str] = field(default_factory=list)
    missing_roles: list[str] = field(default_factory=list)
    unclassified: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        parts = [f"database grants {len(self.granted)} added, {len(self.revoked)} removed"]
        if self.created_roles:
            parts.append(f"roles created without LOGIN {self.created_roles}")
        if self.missing_roles:
            parts.append(f"roles missing (no grants; create them) {self.missing_roles}")
        if self.unclassified:
            parts.append(f"tables only the owner may use (not in db_roles.TABLES) {self.unclassified}")
        return "; ".join(parts)


# A privilege as (role, relation, privilege, column or None for the whole relation).
_Key = tuple[str, str, str, str | None]

_PRESENT = """
SELECT c.relname, r.rolname, a.privilege_type, NULL::text AS column
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND r.rolname = ANY($1::text[])
UNION ALL
SELECT c.relname, r.rolname, a.privilege_type, att.attname
FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(att.attacl) a JOIN pg_roles r ON r.oid = a.grantee
WHERE n.nspname = 'public' AND att.attnum > 0 AND NOT att.attisdropped AND r.rolname = ANY($1::text[])
"""


async def apply(conn: Any) -> Changes:
    """Makes the privileges of every component's role on the schema's tables and sequences
    equal to the table, in one transaction, through an asyncpg connection of the owner (the
    role bootstrap runs as); returns what changed. Also: only these roles (and the owner) may
    connect to the database, nobody may create objects in it (temporary tables: only
    TEMP_TABLE_HOLDERS), and with a
    superuser connection (compose, testcontainers) the advisory locks are the owner's and the
    aggregator's only."""
    changes = Changes()
    owner = await conn.fetchval("SELECT current_user")
    database = await conn.fetchval("SELECT current_database()")
    me = await conn.fetchrow("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")
    roles = {s: role_name(owner, s) for s in SERVICES}
    async with conn.transaction():
        existing = {
            r["rolname"]
            for r in await conn.fetch(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])", list(roles.values())
            )
        }
        for role in roles.values():
            if role in existing:
                continue
            if me["rolsuper"] or me["rolcreaterole"]:
                await conn.execute(f"CREATE ROLE {quote_ident(role)} NOLOGIN")
                changes.created_roles.append(role)
                existing.add(role)
            else:
                changes.missing_roles.append(role)
        present_roles = [r for r in roles.values() if r in existing]
        # The database: connect (only these roles and the owner), no temporary tables for
        # anyone but the owner and TEMP_TABLE_HOLDERS; the schema: nobody but its owner
        # creates objects in it.
        db = quote_ident(database)
        await conn.execute(f"REVOKE ALL ON DATABASE {db} FROM PUBLIC")
        await conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        if present_roles:
            names = ", ".join(quote_ident(r) for r in present_roles)
            await conn.execute(f"GRANT CONNECT ON DATABASE {db} TO {names}")
            await conn.execute(f"GRANT USAGE ON SCHEMA public TO {names}")
            await conn.execute(f"REVOKE TEMPORARY ON DATABASE {db} FROM {names}")
            temp = [quote_ident(roles[s]) for s in TEMP_TABLE_HOLDERS if roles[s] in existing]
            if temp:
                await conn.execute(f"GRANT TEMPORARY ON DATABASE {db} TO {', '.join(temp)}")
        relations = {
            r["relname"]: r["relkind"]
            for r in await conn.fetch(
                "SELECT c.relname, c.relkind::text AS relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')"
            )
        }
        changes.unclassified = sorted(
            name for name, kind in relations.items() if kind != "S" and name not in TABLES
        )
        wanted: set[_Key] = set()
        for g in grants():
            role = roles[g.service]
            if role not in existing or g.relation not in relations:
                continue
            if not g.except_columns:
                wanted.add((role, g.relation, g.privilege, None))
                continue
            columns = await conn.fetch(
                "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped",
                quote_ident(g.relation),
            )
            wanted |= {
                (role, g.relation, g.privilege, c["attname"])
                for c in columns
                if c["attname"] not in g.except_columns
            }
        present: set[_Key] = {
            (r["rolname"], r["relname"], r["privilege_type"], r["column"])
            for r in await conn.fetch(_PRESENT, present_roles)
        }
        for role, relation, privilege, column in sorted(present - wanted, key=_order):
            kind = "SEQUENCE " if relations.get(relation) == "S" else ""
            cols = f" ({quote_ident(column)})" if column else ""
            await conn.execute(
                f"REVOKE {privilege}{cols} ON {kind}{quote_ident(relation)} FROM {quote_ident(role)}"
            )
            changes.revoked.append(_describe(role, relation, privilege, column))
        for role, relation, privilege, column in sorted(wanted - present, key=_order):
            kind = "SEQUENCE " if relations.get(relation) == "S" else ""
            cols = f" ({quote_ident(column)})" if column else ""
            await conn.execute(
                f"GRANT {privilege}{cols} ON {kind}{quote_ident(relation)} TO {quote_ident(role)}"
            )
            changes.granted.append(_describe(role, relation, privilege, column))
        if me["rolsuper"] and present_roles:
            await conn.execute(superuser_sql(owner, database))
    return changes


async def apply_dsn(dsn: str) -> Changes:
    """apply() on a connection of its own to `dsn` (the owner's), under the migrations' lock
    (two bootstraps at once change the catalog one after the other)."""
    import asyncpg

    from evalstream.common.db import MIGRATION_LOCK

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        try:
            return await apply(conn)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    finally:
        await conn.close()


def _order(key: _Key) -> tuple[str, str, str, str]:
    role, relation, privilege, column = key
    return role, relation, privilege, column or ""


def _describe(role: str, relation: str, privilege: str, column: str | None) -> str:
    return f"{role} {privilege} {relation}{f'.{column}' if column else ''}"


def table_lines(services: Iterable[str] = SERVICES) -> list[str]:
    return [str(g) for g in grants() if g.service in services]


def main() -> None:
    print("\n".join(table_lines()))
    print(f"{', '.join(NO_DATABASE)}: no database role; the owner: everything (migrations, bootstrap)")


if __name__ == "__main__":
    main()
