"""evalctl: submit evaluation runs and read their results.

Commands talk to Kafka (submitting, redriving), the S3 store (uploading datasets) and
PostgreSQL (progress, results, reports), configured by the same environment variables as
the services (KAFKA_BOOTSTRAP, DATABASE_URL, S3_ENDPOINT, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib

# Nothing else at import time: the console script imports this module, and so does every
# process that `evalctl submit` spawns to check a large dataset (a fresh interpreter imports
# its parent's main script); the commands' libraries load in main().

# One module per command (or command group), in `--help` order. Each defines
#     def register(sub: argparse._SubParsersAction) -> None
# which adds its sub-parser(s) with `set_defaults(handler=async_fn)`, where
# `async_fn(args: argparse.Namespace, settings: Settings) -> None`; shared helpers live in
# evalstream.cli.common.
COMMAND_MODULES: list[str] = [
    "evalstream.cli.submit",
    "evalstream.cli.status",
    "evalstream.cli.results",
    "evalstream.cli.report",
    "evalstream.cli.dlq",
    "evalstream.cli.workers",
    "evalstream.cli.datasets_cmd",
    "evalstream.cli.compare",
    "evalstream.cli.reproduce",
    "evalstream.cli.audit",
    "evalstream.cli.regrade",
    "evalstream.cli.export",
]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="evalctl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return ap


def main(argv: list[str] | None = None) -> None:
    import asyncpg
    import urllib3
    from aiokafka.errors import KafkaError
    from minio.error import MinioException

    from evalstream.cli.common import fail
    from evalstream.common import telemetry
    from evalstream.common.kafka_security import KafkaSecurityError
    from evalstream.common.redact import redact
    from evalstream.common.settings import Settings

    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    telemetry.setup("evalctl")  # the jobs evalctl publishes start their runs' traces
    try:
        asyncio.run(args.handler(args, settings))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except KafkaSecurityError as exc:
        fail(str(exc))
    except (OSError, asyncpg.PostgresError, KafkaError, MinioException, urllib3.exceptions.HTTPError) as exc:
        fail(redact(f"{type(exc).__name__}: {exc} (is the stack up? `make up`)"))
    finally:
        telemetry.shutdown()


if __name__ == "__main__":
    main()
