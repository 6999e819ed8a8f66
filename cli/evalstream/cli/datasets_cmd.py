"""`evalctl datasets list` and `evalctl datasets diff A B`: dataset versions.

A version is a dataset's content (`content_sha256`: the items, whatever their order or
file format), so the same questions under another file name are the same version and a
changed gold label is a new one. The producer records every version it sees in the
`dataset_versions` table, with its content-addressed copy in S3. A and B name a version by
its content hash (a unique prefix will do) or are dataset files.
"""

from __future__ import annotations

import argparse
from typing import Any

from evalstream.cli.common import EXIT_REJECTED, database, fail, out_json
from evalstream.common.analysis.versions import DatasetRefError, diff_items, list_versions, load_ref
from evalstream.common.settings import Settings

SHOWN = 20


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
