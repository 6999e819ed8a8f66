"""Least privilege in PostgreSQL, on the real stack: every role (db_roles.py) may do what its
table grants and is refused the rest, the owner is handed to no one, and grants follow later
migrations. The object store: tests/integration/test_store_privileges_s3.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from evalstream.common import acls, db_roles
from evalstream.common.settings import Settings
from tests.support import admin_database_url, principal_settings, unique

# local_stack (conftest.py): these tests are about the local stack's roles and identities
pytestmark = [pytest.mark.stack, pytest.mark.usefixtures("local_stack")]

# --------------------------------------------------------------------------- PostgreSQL


async def connect(principal: str) -> asyncpg.Connection:
    return await asyncpg.connect(principal_settings(principal).database_url)


async def test_each_principal_connects_as_its_own_role_and_the_owner_is_handed_to_no_one(
    stack: Settings,
) -> None:
    admin = await asyncpg.connect(admin_database_url())
    try:
        owner = await admin.fetchval("SELECT current_user")
        table_owners = {
            r["tableowner"]
            for r in await admin.fetch("SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")
        }
    finally:
        await admin.close()
    assert table_owners == {owner}
    seen = {}
    for principal in db_roles.SERVICES:
        conn = await connect(principal)
        try:
            seen[principal] = await conn.fetchrow(
                "SELECT current_user AS role, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls"
                " FROM pg_roles WHERE rolname = current_user"
            )
        finally:
            await conn.close()
    for principal, row in seen.items():
        assert row["role"] == db_roles.role_name(owner, principal) != owner, principal
        assert not any((row["rolsuper"], row["rolcreaterole"], row["rolcreatedb"], row["rolbypassrls"])), (
            principal
        )
    # What `stack.py env` hands evalctl and the tests is the users' role, not the owner's.
    assert urlsplit(stack.database_url).username == db_roles.role_name(owner, acls.USER)
    assert principal_settings(acls.ROUTER).database_url == ""  # no role at all


def _column_probe(relation: str, column: str) -> str:
    return f"SELECT {db_roles.quote_ident(column)} FROM {db_roles.quote_ident(relation)} LIMIT 0"


async def allowed(conn: asyncpg.Connection, sql: str) -> bool:
    """Whether the role may run `sql`: the privilege check passed (the statement ran, or
    failed on something else, e.g. a NOT NULL column). In a transaction that is rolled back,
    so nothing it does stays."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(sql)
        return True
    except asyncpg.InsufficientPrivilegeError:
        return False
    except asyncpg.PostgresError:
        return True
    finally:
        await tx.rollback()


async def schema(conn: asyncpg.Connection) -> dict[str, list[tuple[str, bool]]]:
    """table -> its columns (name, whether it can be assigned: not generated)."""
    rows = await conn.fetch(
        "SELECT c.relname, a.attname, a.attgenerated = '' AND a.attidentity = '' AS assignable"
        " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY c.relname, a.attnum"
    )
    out: dict[str, list[tuple[str, bool]]] = {}
    for r in rows:
        out.setdefault(r["relname"], []).append((r["attname"], r["assignable"]))
    return out


@pytest.mark.parametrize("principal", db_roles.SERVICES)
async def test_each_role_may_do_what_the_table_grants_and_is_refused_the_rest(principal: str) -> None:
    conn = await connect(principal)
    try:
        tables = await schema(conn)
        assert set(db_roles.TABLES) <= set(tables)
        expected: dict[str, bool] = {}
        actual: dict[str, bool] = {}
        for relation, columns in tables.items():
            t = db_roles.quote_ident(relation)
            settable = next(c for c, assignable in columns if assignable)
            probes = {
                f"INSERT {relation}": (f"INSERT INTO {t} DEFAULT VALUES", ("INSERT", None)),
                f"UPDATE {relation}": (
                    f"UPDATE {t} SET {db_roles.quote_ident(settable)} = NULL WHERE false",
                    ("UPDATE", settable),
                ),
                f"DELETE {relation}": (f"DELETE FROM {t} WHERE false", ("DELETE", None)),
                f"TRUNCATE {relation}": (f"TRUNCATE {t}", ("TRUNCATE", None)),
                **{f"SELECT {relation}.{c}": (_column_probe(relation, c), ("SELECT", c)) for c, _ in columns},
            }
            for name, (sql, (privilege, column)) in probes.items():
                expected[name] = db_roles.allows(principal, relation, privilege, column)
                actual[name] = await allowed(conn, sql)
        expected["nextval dead_letters_id_seq"] = db_roles.allows(principal, "dead_letters_id_seq", "USAGE")
        actual["nextval dead_letters_id_seq"] = await allowed(conn, "SELECT nextval('dead_letters_id_seq')")
        # only the aggregator makes temporary tables (its staging table, store.py)
        expected["CREATE TEMP TABLE"] = principal in db_roles.TEMP_TABLE_HOLDERS
        actual["CREATE TEMP TABLE"] = await allowed(conn, "CREATE TEMP TABLE probe_privileges (i int)")
        # nobody but the owner creates anything else: tables, schemas, functions
        for name, sql in {
            "CREATE TABLE": "CREATE TABLE probe_privileges (i int)",
            "CREATE SCHEMA": "CREATE SCHEMA probe_privileges",
            "CREATE FUNCTION": "CREATE FUNCTION probe_privileges() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "ALTER TABLE runs": "ALTER TABLE runs ADD COLUMN probe_privileges int",
            "DROP TABLE answer_cache": "DROP TABLE answer_cache",
        }.items():
            expected[name] = False
            actual[name] = await allowed(conn, sql)
        # the advisory locks that serialise the aggregators' sink and the migrations: only the
        # aggregator (and the owner) may take one (a random key: no real lock is touched)
        key = uuid.uuid4().int >> 65
        expected["advisory lock"] = principal in db_roles.ADVISORY_LOCK_HOLDERS
        actual["advisory lock"] = await allowed(conn, f"SELECT pg_try_advisory_xact_lock({key})")
        # but everyone releases their own (asyncpg's pool does, whenever it takes a connection back)
        expected["release own advisory locks"] = True
        actual["release own advisory locks"] = await allowed(conn, "SELECT pg_advisory_unlock_all()")
    finally:
        await conn.close()
    assert {k for k, v in expected.items() if v}, "every role is granted something"
    assert actual == expected


@pytest.fixture
async def foreign_run() -> AsyncIterator[str]:
    """A run with one result, made by the owner (as another user's run would be)."""
    run_id = unique("foreign")
    conn = await asyncpg.connect(admin_database_url())
    try:
        await conn.execute(
            "INSERT INTO runs (run_id, status, model, grader, spec) VALUES ($1, 'completed', 'null', 'exact', '{}')",
            run_id,
        )
        await conn.execute(
            "INSERT INTO item_results (run_id, item_id, shard_id, correct, score, ordinal) VALUES ($1, 'q1', 's', false, 0, 0)",
            run_id,
        )
        yield run_id
    finally:
        await conn.execute("DELETE FROM runs WHERE run_id = $1", run_id)
        await conn.close()


async def test_the_database_attack_of_the_issue_is_refused(stack: Settings, foreign_run: str) -> None:
    """With the DATABASE_URL `stack.py env` hands out, a user can neither forge another run's
    results nor create anything; the producer cannot write results; a worker cannot read runs."""
    user = await asyncpg.connect(stack.database_url)
    try:
        assert await user.fetchval("SELECT correct FROM item_results WHERE run_id = $1", foreign_run) is False
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await user.execute(
                "UPDATE item_results SET correct = true, score = 1 WHERE run_id = $1", foreign_run
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await user.execute("CREATE TABLE forged (i int)")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await user.execute("DELETE FROM runs WHERE run_id = $1", foreign_run)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # another run's work, as it failed
            await user.fetch("SELECT payload FROM dead_letters LIMIT 1")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await user.fetch("SELECT response FROM answer_cache LIMIT 1")
        assert await user.fetchval("SELECT count(*) FROM dead_letters WHERE run_id = $1", foreign_run) == 0
    finally:
        await user.close()
    producer = await connect(acls.PRODUCER)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await producer.execute("UPDATE item_results SET correct = true WHERE run_id = $1", foreign_run)
    finally:
        await producer.close()
    worker = await connect(acls.WORKER)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await worker.fetch("SELECT run_id FROM runs LIMIT 1")
    finally:
        await worker.close()
    admin = await asyncpg.connect(admin_database_url())
    try:
        row = await admin.fetchrow("SELECT correct, score FROM item_results WHERE run_id = $1", foreign_run)
        assert (row["correct"], row["score"]) == (False, 0)
    finally:
        await admin.close()


async def test_grants_follow_later_migrations_and_stray_grants_go() -> None:
    """What a later migration adds is covered by the next bootstrap (db_roles.apply): a new
    column of a table with a column grant (dead_letters for users) becomes readable, one of a
    table granted whole is readable at once, a new table is the owner's alone; a grant the
    table does not hold is taken away. All in a transaction that is rolled back."""
    conn = await asyncpg.connect(admin_database_url())
    user = db_roles.role_name(await conn.fetchval("SELECT current_user"), acls.USER)
    try:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("SET LOCAL lock_timeout = '10s'")
            await conn.execute("ALTER TABLE item_results ADD COLUMN probe_later text")
            await conn.execute("ALTER TABLE dead_letters ADD COLUMN probe_later text")
            await conn.execute("CREATE TABLE probe_later_table (i int)")
            await conn.execute(f"GRANT DELETE ON item_results TO {db_roles.quote_ident(user)}")

            async def may(sql: str) -> bool:
                return bool(await conn.fetchval(sql, user))

            # before: the table-wide grant covers the new column already; the column grant not yet
            assert await may("SELECT has_column_privilege($1, 'item_results', 'probe_later', 'SELECT')")
            assert not await may("SELECT has_column_privilege($1, 'dead_letters', 'probe_later', 'SELECT')")
            changes = await db_roles.apply(conn)
            assert await may("SELECT has_column_privilege($1, 'dead_letters', 'probe_later', 'SELECT')")
            assert not await may("SELECT has_column_privilege($1, 'dead_letters', 'payload', 'SELECT')")
            assert not await may("SELECT has_table_privilege($1, 'item_results', 'DELETE')")
            assert f"{user} DELETE item_results" in changes.revoked
            assert changes.unclassified == ["probe_later_table"]
            owner = await conn.fetchval("SELECT current_user")
            for role in (db_roles.role_name(owner, s) for s in db_roles.SERVICES):
                assert not await conn.fetchval(
                    "SELECT has_table_privilege($1, 'probe_later_table', 'SELECT,INSERT,UPDATE,DELETE')", role
                ), role
            # and applied again, nothing changes: bootstrap is idempotent
            again = await db_roles.apply(conn)
            assert (again.granted, again.revoked) == ([], [])
        finally:
            await tx.rollback()
    finally:
        await conn.close()
