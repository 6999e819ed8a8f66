"""The table of database grants (libs/common db_roles.py) against the SQL each component's
code runs: every table a component reads or writes is granted to its role, and nothing beyond
that is; every table the migrations create is classified; the SQL for the roles is what
PostgreSQL needs. The grants on the real database: tests/integration/test_store_privileges_postgres.py."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from evalstream.common import acls, db, db_roles

ROOT = Path(__file__).resolve().parents[2]
COMMON = ROOT / "libs/common/evalstream/common"
# Where each component's SQL lives: its own package, and the shared modules it imports.
SOURCES = {
    acls.PRODUCER: [ROOT / "services/producer"],
    acls.AGGREGATOR: [ROOT / "services/aggregator"],
    acls.WORKER: [ROOT / "services/worker"],
    acls.USER: [ROOT / "cli"],
    acls.ROUTER: [ROOT / "services/router"],
}


def common_modules(files: list[Path]) -> set[Path]:
    """libs/common modules `files` import, transitively (from subpackages too: analysis/)."""
    seen: set[Path] = set()
    todo = list(files)
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_text())):
            if not (
                isinstance(node, ast.ImportFrom)
                and node.module
                and (node.module + ".").startswith("evalstream.common.")
            ):
                continue
            package = COMMON.joinpath(*node.module.split(".")[2:])  # evalstream.common.analysis
            # the module itself, and each name that is a module of its package
            candidates = [package.with_suffix(".py"), *(package / f"{a.name}.py" for a in node.names)]
            for path in candidates:
                if path.exists() and path not in seen:
                    seen.add(path)
                    todo.append(path)
    return seen


def module_name(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[parts.index("evalstream") :])


def sql_strings(path: Path) -> list[str]:
    """The string constants of a module (docstrings and comments are not SQL: a docstring is
    skipped), f-strings with their fields blanked, and the module's string attributes as built
    at import (statements put together from pieces, e.g. the aggregator's UPSERT)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(str(v.value) if isinstance(v, ast.Constant) else " x " for v in node.values))
    if path.name == "__main__.py":  # importing it would run the program
        return out
    module = importlib.import_module(module_name(path))
    out += [v for v in vars(module).values() if isinstance(v, str) and v is not module.__doc__]
    return out


def needs(component: str) -> set[tuple[str, str]]:
    """(relation, privilege) that the component's SQL needs."""
    files = [p for folder in SOURCES[component] for p in folder.rglob("*.py")]
    tables = "|".join(db_roles.TABLES)
    out: set[tuple[str, str]] = set()
    for path in [*files, *common_modules(files)]:
        if path.name in ("db.py", "db_roles.py", "bootstrap.py"):  # the owner's (migrations, grants)
            continue
        for text in sql_strings(path):
            sql = " ".join(text.split())
            for table in re.findall(rf"\bINSERT INTO ({tables})\b", sql):
                out.add((table, "INSERT"))
                if re.search(r"\bRETURNING\b|ON CONFLICT \([^)]*\) DO UPDATE", sql):
                    out.add((table, "SELECT"))
                if "DO UPDATE" in sql:
                    out.add((table, "UPDATE"))
                if table == "dead_letters":  # its id is a bigserial
                    out.add(("dead_letters_id_seq", "USAGE"))
            for table in re.findall(rf"\bUPDATE ({tables}) SET\b", sql):
                out |= {(table, "UPDATE"), (table, "SELECT")}  # WHERE reads the table
            for table in re.findall(rf"\bDELETE FROM ({tables})\b", sql):
                out |= {(table, "DELETE"), (table, "SELECT")}
            for table in re.findall(rf"\b(?:FROM|JOIN) ({tables})\b", sql):
                out.add((table, "SELECT"))
    return out


def granted(component: str) -> set[tuple[str, str]]:
    return {(g.relation, g.privilege) for g in db_roles.grants() if g.service == component}


@pytest.mark.parametrize("component", list(SOURCES))
def test_each_role_is_granted_what_its_code_needs_and_nothing_more(component: str) -> None:
    assert needs(component) == granted(component)


def test_the_scan_finds_the_components_sql() -> None:
    """The scan itself sees what it must: the worker's cache, the producer's runs, the
    aggregator's results and dead letters, evalctl's reads, and nothing for the router."""
    assert ("answer_cache", "INSERT") in needs(acls.WORKER)
    assert ("runs", "UPDATE") in needs(acls.PRODUCER)
    assert {("item_results", "UPDATE"), ("dead_letters", "INSERT")} <= needs(acls.AGGREGATOR)
    assert {("runs", "SELECT"), ("dead_letters", "SELECT")} <= needs(acls.USER)
    assert needs(acls.ROUTER) == set()
    assert acls.ROUTER in db_roles.NO_DATABASE and acls.ROUTER not in db_roles.SERVICES


def test_what_users_must_not_read() -> None:
    """A dead letter's payload is the work that failed (another run's items, not readable on
    eval.work either) and the answer cache is every run's answers: users read neither, nor do
    they write anything."""
    assert not db_roles.allows(acls.USER, "dead_letters", "SELECT", "payload")
    assert db_roles.allows(acls.USER, "dead_letters", "SELECT", "error")
    assert not db_roles.allows(acls.USER, "answer_cache", "SELECT")
    assert not any(g.privilege != "SELECT" for g in db_roles.grants() if g.service == acls.USER)
    # the promises
    assert not db_roles.allows(acls.PRODUCER, "item_results", "UPDATE")
    assert not db_roles.allows(acls.WORKER, "runs", "SELECT")
    assert not any(g.privilege == "DELETE" for g in db_roles.grants())
    assert not any(g.relation == "schema_migrations" for g in db_roles.grants())


def test_every_table_the_migrations_create_is_classified() -> None:
    """A migration that creates a table must say who may use it (db_roles.TABLES and the
    grants); until then only the owner can."""
    created = {
        name
        for _, _, sql in db.migrations()
        for name in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", sql, re.I)
    }
    assert created <= set(db_roles.TABLES) - {"schema_migrations"}, created - set(db_roles.TABLES)
    assert {g.relation for g in db_roles.grants() if g.kind == "table"} <= set(db_roles.TABLES)
    assert {g.relation for g in db_roles.grants() if g.kind == "sequence"} <= set(db_roles.SEQUENCES)
    # bigserial columns' sequences are known too
    serial = {
        f"{table}_{column}_seq"
        for _, _, sql in db.migrations()
        for table, body in re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", sql, re.S)
        for column in re.findall(r"^\s*(\w+)\s+(?:big)?serial\b", body, re.M)
    }
    assert serial == set(db_roles.SEQUENCES)


def test_role_names_follow_the_owner() -> None:
    assert db_roles.role_name("evalstream", acls.USER) == "evalstream_user"
    assert db_roles.role_name("acme", acls.AGGREGATOR) == "acme_aggregator"
    with pytest.raises(ValueError):
        db_roles.role_name("evalstream", acls.ROUTER)


def test_the_login_roles_sql_quotes_and_sets_no_attribute_beyond_login() -> None:
    sql = db_roles.login_roles_sql("evalstream", {acls.USER: "it's", acls.WORKER: "w"})
    assert "SET password_encryption = 'scram-sha-256';" in sql
    assert "PASSWORD 'it''s'" in sql  # quoted, never breaking out of the literal
    assert sql.count("CREATE ROLE") == 2 and '"evalstream_user"' in sql and '"evalstream_worker"' in sql
    for attribute in ("NOSUPERUSER", "NOCREATEDB", "NOCREATEROLE", "NOREPLICATION", "NOBYPASSRLS"):
        assert sql.count(attribute) == 2, attribute


def test_advisory_locks_are_the_owners_and_the_aggregators() -> None:
    sql = db_roles.superuser_sql("evalstream", "evalstream")
    revoke, grant, unlock_all = sql.strip().splitlines()
    assert revoke.startswith("REVOKE EXECUTE ON FUNCTION pg_catalog.pg_advisory_lock(bigint)")
    assert revoke.endswith("FROM PUBLIC;")
    assert grant.endswith('TO "evalstream", "evalstream_aggregator";')
    assert unlock_all == "GRANT EXECUTE ON FUNCTION pg_catalog.pg_advisory_unlock_all() TO PUBLIC;"
    # the aggregator's sink lock and the migrations' lock are among the revoked
    assert "pg_catalog.pg_advisory_lock(bigint)" in db_roles.ADVISORY_LOCK_FUNCTIONS
    assert "pg_catalog.pg_try_advisory_lock(bigint)" in db_roles.ADVISORY_LOCK_FUNCTIONS
