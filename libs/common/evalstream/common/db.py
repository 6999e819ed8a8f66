"""PostgreSQL: connection pools and schema migrations (numbered SQL files, applied once,
under an advisory lock so that services starting together don't race)."""

from __future__ import annotations

from importlib import resources

import asyncpg

MIGRATION_LOCK = 0x65766C73  # "evls": migrations and grants (db_roles) one at a time


def migrations() -> list[tuple[int, str, str]]:
    files = sorted(
        (
            f
            for f in resources.files("evalstream.common").joinpath("migrations").iterdir()
            if f.name.endswith(".sql")
        ),
        key=lambda f: f.name,
    )
    return [(int(f.name.split("_", 1)[0]), f.name, f.read_text()) for f in files]


async def migrate(dsn: str) -> list[str]:
    """Applies the migrations not applied yet; returns their names."""
    conn = await asyncpg.connect(dsn)
    applied: list[str] = []
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in migrations():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                )
            applied.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
        await conn.close()
    return applied


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 8) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=60)
    assert pool is not None
    return pool
