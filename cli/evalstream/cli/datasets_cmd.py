"""`evalctl datasets list` and `evalctl datasets diff A B`: dataset versions.

A version is a dataset's content (`content_sha256`: the items, whatever their order or
file format), so the same questions under another file name are the same version and a
changed gold label is a new one. The producer records every version it sees in the
`dataset_versions` table, with its content-addressed copy in S3. A and B name a version by
its content hash (a unique prefix will do) or are dataset files.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from evalstream.cli.common import EXIT_REJECTED, database, fail, out_json
from evalstream.common import storage
from evalstream.common.messages import Item
from evalstream.common.regrading import StoredCopyError, stored_items
from evalstream.common.settings import Settings

_HEX = re.compile(r"[0-9a-f]{4,64}")
_DIFF_FIELDS = ("question", "messages", "answer", "choices", "category", "entry_point", "test", "meta")
SHOWN = 20


@dataclass(frozen=True)
class Dataset:
    content_sha256: str
    items: list[Item]
    label: str  # the file the user named, or the name the version was first submitted as


class DatasetRefError(LookupError):
    pass


# --------------------------------------------------------------------------- pure


def diff_items(a: Sequence[Item], b: Sequence[Item]) -> dict[str, Any]:
    """What changed from version A to version B, item by item (matched by id)."""
    by_a, by_b = {i.id: i for i in a}, {i.id: i for i in b}
    common = sorted(by_a.keys() & by_b.keys())
    changed: dict[str, list[dict[str, Any]]] = {"question": [], "answer": [], "other": []}
    for item_id in common:
        x, y = msgspec.to_builtins(by_a[item_id]), msgspec.to_builtins(by_b[item_id])
        fields = [f for f in _DIFF_FIELDS if x.get(f) != y.get(f)]
        if not fields:
            continue
        entry = {
            "id": item_id,
            "fields": fields,
            "a": {f: x.get(f) for f in fields},
            "b": {f: y.get(f) for f in fields},
        }
        if "question" in fields or "messages" in fields:
            changed["question"].append(entry)
        if "answer" in fields:
            changed["answer"].append(entry)
        if not {"question", "messages", "answer"} & set(fields):
            changed["other"].append(entry)
    return {
        "added": sorted(by_b.keys() - by_a.keys()),
        "removed": sorted(by_a.keys() - by_b.keys()),
        "question_changed": changed["question"],
        "answer_changed": changed["answer"],
        "other_changed": changed["other"],
        "unchanged": len(common) - len({e["id"] for v in changed.values() for e in v}),
    }


# --------------------------------------------------------------------------- resolving


def read_items(data: bytes, filename: str) -> tuple[str, list[Item]]:
    """(content_sha256, items) of a dataset file's bytes, validated as the producer does."""
    from evalstream.common.datasets import load_dataset

    loaded = load_dataset(data, filename)
    return loaded.content_sha256, loaded.items


async def resolve_version(conn: asyncpg.Connection, ref: str) -> asyncpg.Record:
    """The dataset_versions row whose content hash starts with `ref`."""
    rows = await conn.fetch(
        "SELECT * FROM dataset_versions WHERE content_sha256 LIKE $1 || '%' ORDER BY created_at LIMIT 5",
        ref.lower(),
    )
    if not rows:
        raise DatasetRefError(f"no dataset version {ref!r} (see `evalctl datasets list`), and no such file")
    if len(rows) > 1:
        shown = ", ".join(r["content_sha256"][:12] for r in rows)
        raise DatasetRefError(f"dataset version prefix {ref!r} is ambiguous: {shown}")
    return rows[0]


async def load_ref(conn: asyncpg.Connection, settings: Settings, ref: str) -> Dataset:
    """A dataset named by a file path or a version's content hash (prefix)."""
    from evalstream.common.datasets import DatasetError

    path = Path(ref)
    try:
        if path.is_file():
            data = await asyncio.to_thread(path.read_bytes)
            digest, items = await asyncio.to_thread(read_items, data, path.name)
            return Dataset(digest, items, str(path))
        if not _HEX.fullmatch(ref.lower()):
            raise DatasetRefError(f"{ref!r} is neither a file nor a dataset version (content hash)")
        row = await resolve_version(conn, ref)
        s3 = storage.client(settings)
        items = await asyncio.to_thread(stored_items, s3, row["uri"], row["content_sha256"])
    except DatasetError as exc:
        raise DatasetRefError(f"{ref}: {exc}") from exc
    except StoredCopyError as exc:
        raise DatasetRefError(f"version {row['content_sha256'][:12]}: {exc}") from exc
    return Dataset(row["content_sha256"], items, row["name"])


# --------------------------------------------------------------------------- commands


async def list_versions(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every version, oldest first per name, numbered per name (v1, v2, ...)."""
    rows = await conn.fetch(
        "SELECT v.*, (SELECT count(*) FROM runs r WHERE r.dataset_sha256 = v.content_sha256) AS runs,"
        " row_number() OVER (PARTITION BY v.name ORDER BY v.created_at, v.content_sha256) AS version"
        " FROM dataset_versions v ORDER BY v.name, v.created_at, v.content_sha256"
    )
    return [
        {
            "content_sha256": r["content_sha256"],
            "name": r["name"],
            "version": r["version"],
            "names": list(r["names"]),
            "items": r["items"],
            "runs": r["runs"],
            "first_run_id": r["first_run_id"],
            "created_at": r["created_at"].isoformat(),
            "uri": r["uri"],
        }
        for r in rows
    ]


def print_diff(d: dict[str, Any], label_a: str, label_b: str) -> None:
    print(f"A = {label_a}\nB = {label_b}")
    print(
        f"  {len(d['added'])} added, {len(d['removed'])} removed, {len(d['question_changed'])} questions changed,"
        f" {len(d['answer_changed'])} gold answers changed, {len(d['other_changed'])} otherwise changed,"
        f" {d['unchanged']} unchanged"
    )
    for key, sign in (("added", "+"), ("removed", "-")):
        for item_id in d[key][:SHOWN]:
            print(f"  {sign} {item_id}")
        if len(d[key]) > SHOWN:
            print(f"  {sign} ... and {len(d[key]) - SHOWN} more")
    for key, what in (
        ("question_changed", "question"),
        ("answer_changed", "answer"),
        ("other_changed", None),
    ):
        for e in d[key][:SHOWN]:
            fields = [what] if what else e["fields"]
            for f in fields:
                f = "messages" if f == "question" and "messages" in e["fields"] else f
                print(f"  ~ {e['id']} {f}: {_short(e['a'].get(f))} -> {_short(e['b'].get(f))}")
        if len(d[key]) > SHOWN:
            print(f"  ~ ... and {len(d[key]) - SHOWN} more")


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


async def cmd_datasets(args: argparse.Namespace, settings: Settings) -> None:

    async with database(settings) as conn:
        if args.datasets_cmd == "list":
            versions = await list_versions(conn)
            if args.json:
                out_json(versions)
                return
            print(
                f"{'content sha256':<14} {'name':<32} {'ver':>3} {'items':>7} {'runs':>5}  first run / created"
            )
            for v in versions:
                print(
                    f"{v['content_sha256'][:12]:<14} {v['name'][:32]:<32} {'v' + str(v['version']):>3} {v['items']:>7}"
                    f" {v['runs']:>5}  {v['first_run_id']}  {v['created_at'][:19]}"
                )
                others = [n for n in v["names"] if n != v["name"]]
                if others:
                    print(f"{'':<14} also as: {', '.join(others)}")
            return
        try:
            a, b = [await load_ref(conn, settings, r) for r in (args.a, args.b)]
        except DatasetRefError as exc:
            fail(str(exc), EXIT_REJECTED)
    d = diff_items(a.items, b.items)
    d = {
        "a": {"content_sha256": a.content_sha256, "label": a.label},
        "b": {"content_sha256": b.content_sha256, "label": b.label},
        "identical": a.content_sha256 == b.content_sha256,
        **d,
    }
    if args.json:
        out_json(d)
    else:
        print_diff(d, f"{a.label}  [{a.content_sha256[:12]}]", f"{b.label}  [{b.content_sha256[:12]}]")
        if d["identical"]:
            print("  same version: identical content")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "datasets",
        help="dataset versions: list them, diff two",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dsub = p.add_subparsers(dest="datasets_cmd", required=True)
    ls = dsub.add_parser("list", help="every dataset version the pipeline has seen")
    ls.add_argument("--json", action="store_true")
    df = dsub.add_parser("diff", help="items added, removed, and whose question or gold answer changed")
    df.add_argument("a", help="content hash (prefix) or dataset file")
    df.add_argument("b", help="content hash (prefix) or dataset file")
    df.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_datasets)
