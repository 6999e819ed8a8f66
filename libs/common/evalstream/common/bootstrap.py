"""Creates what the services need before they start: Kafka topics, the ACLs of every
principal (acls.py; when the broker authenticates, so run it as the admin principal), S3
buckets, the database schema and the privileges of every component's database role
(db_roles.py; run it as the owner of the tables). Idempotent; run by `make up` and by
docker-compose's bootstrap service.

    python -m evalstream.common.bootstrap [--groups smollm2-cpu,light]
"""

from __future__ import annotations

import argparse
import asyncio

from aiokafka.admin import AIOKafkaAdminClient

from evalstream.common import acls, db, db_roles, storage
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.settings import BootstrapSettings
from evalstream.common.topics_admin import ensure_topic_layout


def default_groups() -> list[str]:
    settings = BootstrapSettings.from_env()
    groups = [g.strip() for g in settings.worker_groups.split(",") if g.strip()]
    return groups or [settings.worker_group]


async def bootstrap(settings: BootstrapSettings, groups: list[str]) -> None:
    changes = await ensure_topic_layout(settings, groups)
    acl_change = "broker without authentication: no ACLs"
    if settings.kafka_security_protocol.upper() != "PLAINTEXT":
        admin = AIOKafkaAdminClient(**client_kwargs(settings))
        await admin.start()
        try:
            created, deleted = await acls.apply(admin)
        finally:
            await admin.close()
        acl_change = f"ACLs created {len(created)}, deleted {len(deleted)}"
    buckets = await asyncio.to_thread(storage.ensure_buckets, settings)
    applied = await db.migrate(settings.database_url)
    privileges = await db_roles.apply_dsn(settings.database_url)
    print(
        f"bootstrap: topics created {changes.created or 'none'}; partitions raised "
        f"{ {t: f'{a}->{b}' for t, (a, b) in changes.grown.items()} or 'none' }; {acl_change}; "
        f"buckets created {buckets or 'none'}; "
        f"migrations applied {applied or 'none'}; {privileges}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--groups", default=",".join(default_groups()), help="worker groups to make work topics for"
    )
    args = ap.parse_args()
    asyncio.run(bootstrap(BootstrapSettings.from_env(), [g for g in args.groups.split(",") if g]))


if __name__ == "__main__":
    main()
