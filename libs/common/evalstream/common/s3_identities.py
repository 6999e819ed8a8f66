"""Who may do what in the S3 store: one key pair per component that uses it, each allowed only
the actions its code needs, on its buckets and object names, in SeaweedFS's identity syntax
(`Action:bucket` for the whole bucket, `Action:bucket/pattern*` for names matching a pattern;
Read covers GET and HEAD, Write covers PUT, copy, multipart and DELETE, List lists a bucket).
The admin (bootstrap: buckets; operators) may do everything. Workers and routers have no key
pair: they never touch the store.

`identities()` is the one table, named by the bucket settings (S3_BUCKET_DATASETS,
S3_BUCKET_RESULTS); `config()` is SeaweedFS's identity file (`-s3.config`) for given keys.

    python -m evalstream.common.s3_identities       # print the table
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from evalstream.common.acls import ADMIN, AGGREGATOR, PRODUCER, ROUTER, USER, WORKER
from evalstream.common.settings import S3Settings

# Principals with a key pair; the others (router, worker) have none.
PRINCIPALS = (ADMIN, PRODUCER, AGGREGATOR, USER)
NO_STORE = (ROUTER, WORKER)
ADMIN_ACTIONS = ("Admin", "Read", "List", "Tagging", "Write")

# Where evalctl (and any client) uploads datasets: the only names users may write.
UPLOADS_PREFIX = "uploads/"


def identities(settings: S3Settings | None = None) -> dict[str, tuple[str, ...]]:
    """principal -> its SeaweedFS actions."""
    s = settings or S3Settings()
    datasets, results = s.s3_bucket_datasets, s.s3_bucket_results
    return {
        ADMIN: ADMIN_ACTIONS,
        # producer: reads uploads (and stored copies, for reproductions), writes the
        # content-addressed copy and each run's manifest
        PRODUCER: (
            f"Read:{datasets}",
            f"Write:{datasets}/datasets/*",
            f"Write:{results}/runs/*/manifest.json",
        ),
        # aggregator: reads stored copies (a regrade's items), writes each run's Parquet
        # segments and reports and the Delta table (whose commits list, copy and delete)
        AGGREGATOR: (
            f"Read:{datasets}",
            f"Read:{results}",
            f"List:{results}",
            f"Write:{results}/runs/*/results/*",
            f"Write:{results}/runs/*/report.json",
            f"Write:{results}/runs/*/report.html",
            f"Write:{results}/tables/*",
        ),
        # users (evalctl): upload datasets, read stored copies (reproduce, regrade, datasets
        # diff) and results (the Parquet files, the Delta table, reports); never write results
        # nor the stored copies
        USER: (
            f"Read:{datasets}",
            f"Write:{datasets}/{UPLOADS_PREFIX}*",
            f"Read:{results}",
            f"List:{results}",
        ),
    }


def allows(
    principal: str, action: str, bucket: str, key: str = "", settings: S3Settings | None = None
) -> bool:
    """Whether the table lets `principal` do `action` (Read, Write, List, ...) on `bucket`
    (and object `key`), as SeaweedFS decides it: an action on the whole bucket, or a pattern
    matching bucket/key."""
    actions = identities(settings).get(principal, ())
    if "Admin" in actions or action in actions:
        return True
    target = f"{action}:{bucket}/{key}" if key else f"{action}:{bucket}"
    for granted in actions:
        if any(c in granted for c in "*?"):
            if fnmatch.fnmatchcase(target, granted):
                return True
        elif granted == f"{action}:{bucket}":
            return True
    return False


def config(keys: Mapping[str, tuple[str, str]], settings: S3Settings | None = None) -> dict[str, object]:
    """SeaweedFS's identity file for the key pairs `keys` (principal -> (access key, secret
    key)); principals without a key pair get no identity."""
    table = identities(settings)
    return {
        "identities": [
            {
                "name": principal,
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": list(table[principal]),
            }
            for principal, (access, secret) in keys.items()
        ]
    }


def main() -> None:
    for principal, actions in identities().items():
        print(f"{principal:<11} {', '.join(actions)}")
    print(f"{', '.join(NO_STORE)}: no key pair")


if __name__ == "__main__":
    main()
