"""`evalctl audit --dataset D [--runs R1,R2,...]`: gold labels that look wrong.

Three checks, each flag with its evidence:

* `conflicting_duplicate`: the same question (normalised: case, spacing, end punctuation;
  with the same choices) appears more than once with different gold answers. When runs are
  given, the items whose gold the models contradict are the suspects; otherwise all are.
* `models_disagree_with_gold`: runs of *different* models agree on one answer and the grader
  says it is not the gold one: a strict majority of the models that answered the item, and
  at least `--min-agree` of them. Independent models rarely make the same mistake, so their
  agreement against the gold label points at the label. Several runs of one model count once
  (the newest), since a model agreeing with itself is no evidence.
* `unparsable_gold`: the dataset's grader cannot read the gold answer (a numeric grader and
  "4O"; a multiple-choice answer that is none of the choices). With the "auto" grader, an
  item whose gold is not a number in a category that is otherwise numeric is flagged too:
  "auto" would quietly grade it as free text.
"""

from __future__ import annotations

import argparse
import string
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

import asyncpg

from evalstream.common.messages import Item
from evalstream.common.settings import Settings

DUPLICATE = "conflicting_duplicate"
AGREEMENT = "models_disagree_with_gold"
UNPARSABLE = "unparsable_gold"
MIN_AGREE = 2
CATEGORY_SHARE = 0.8  # "auto": a category is numeric when this share of its golds are numbers
_END_PUNCTUATION = (
    string.punctuation + " \u00bf\u00a1\u2026\u201c\u201d\u2018\u2019\u00ab\u00bb\u3002\uff1f\uff01"
)

# item_id -> its result row (extracted, correct, error) in one run
RunResults = Mapping[str, Mapping[str, Any]]


@dataclass
class Flag:
    kind: str
    item_ids: list[str]
    suspects: list[str]  # the items whose gold label is probably the wrong one
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


def normalise(text: str) -> str:
    """Case, spacing and end punctuation do not count; numbers compare by value."""
    text = " ".join(text.casefold().split()).strip(_END_PUNCTUATION)
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)


def _question(item: Item) -> str:
    if item.messages is not None:
        return "\n".join(f"{m.role}: {m.content}" for m in item.messages)
    return item.question or ""


def _says_gold(results: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether the models side with an item's gold answer (None: too few answered)."""
    votes = [bool(r.get("correct")) for r in results if r.get("error") is None]
    if len(votes) < 2 or sum(votes) * 2 == len(votes):
        return None
    return sum(votes) * 2 > len(votes)


# --------------------------------------------------------------------------- checks


def conflicting_duplicates(items: Sequence[Item], runs: Mapping[str, RunResults] | None = None) -> list[Flag]:
    groups: dict[tuple[str, tuple[str, ...] | None], list[Item]] = defaultdict(list)
    for item in items:
        if item.answer is not None:
            groups[(normalise(_question(item)), tuple(item.choices) if item.choices else None)].append(item)
    flags = []
    for (question, _), group in groups.items():
        golds = {normalise(i.answer or "") for i in group}
        if len(group) < 2 or len(golds) < 2:
            continue
        sides = {i.id: _says_gold([r[i.id] for r in (runs or {}).values() if i.id in r]) for i in group}
        suspects = [i.id for i in group if sides[i.id] is False]
        flags.append(
            Flag(
                DUPLICATE,
                [i.id for i in group],
                suspects or [i.id for i in group if sides[i.id] is not True],
                f"{len(group)} items ask the same question with {len(golds)} different gold answers",
                {
                    "question": question,
                    "answers": {i.id: i.answer for i in group},
                    "models_agree_with_gold": sides if runs else None,
                },
            )
        )
    return flags


def model_agreement(
    items: Sequence[Item], runs: Mapping[str, RunResults], *, min_agree: int = MIN_AGREE
) -> list[Flag]:
    """`runs`: model SPEC -> that model's results (one run per model)."""
    if len(runs) < 2:
        return []
    flags = []
    for item in items:
        answered = {
            model: r[item.id]
            for model, r in runs.items()
            if item.id in r and r[item.id].get("error") is None and r[item.id].get("extracted") is not None
        }
        wrong = {m: normalise(str(r["extracted"])) for m, r in answered.items() if r.get("correct") is False}
        if not wrong:
            continue
        answer, votes = Counter(wrong.values()).most_common(1)[0]
        if votes < min_agree or votes * 2 <= len(answered):
            continue
        agreeing = sorted(m for m, a in wrong.items() if a == answer)
        flags.append(
            Flag(
                AGREEMENT,
                [item.id],
                [item.id],
                f"{votes} of {len(answered)} models answer {answer!r}, the gold answer is {item.answer!r}",
                {
                    "gold": item.answer,
                    "agreed_answer": answer,
                    "votes": votes,
                    "models_answered": len(answered),
                    "models": agreeing,
                    "others": {
                        m: answered[m].get("extracted") for m in sorted(answered) if m not in agreeing
                    },
                },
            )
        )
    return flags


def _grading() -> ModuleType | None:
    """The worker's graders, where installed: the producer image carries evalctl without them."""
    try:
        from evalstream.worker import grading
    except ImportError:
        return None
    return grading


def unparsable_golds(items: Sequence[Item], grader: str) -> list[Flag]:
    """Needs the graders (worker code); raises ImportError where they are not installed."""
    grading = _grading()
    if grading is None:
        raise ImportError("evalstream.worker.grading")
    item_problem, resolve_grader = grading.item_problem, grading.resolve_grader
    flags = []
    resolved = {i.id: resolve_grader(grader, i) for i in items}
    numeric_share: dict[str | None, tuple[int, int]] = {}
    if grader == "auto":
        by_category: dict[str | None, list[Item]] = defaultdict(list)
        for i in items:
            if i.answer is not None and not i.choices and not i.test:
                by_category[i.category].append(i)
        for category, group in by_category.items():
            n = sum(resolved[i.id] == "numeric" for i in group)
            numeric_share[category] = (n, len(group))
    for item in items:
        problem = item_problem(grader, item)
        used = resolved[item.id]
        evidence: dict[str, Any] = {"gold": item.answer, "grader": used}
        if problem is None and used == "exact" and item.category in numeric_share:
            n, total = numeric_share[item.category]
            if total >= 3 and n / total >= CATEGORY_SHARE:
                problem = item_problem("numeric", item)
                evidence = {
                    "gold": item.answer,
                    "grader": "numeric",
                    "category": item.category,
                    "numeric_golds_in_category": f"{n}/{total}",
                }
        if problem is not None:
            flags.append(Flag(UNPARSABLE, [item.id], [item.id], problem, evidence))
    return flags


def audit(
    items: Sequence[Item],
    runs: Mapping[str, RunResults],
    *,
    grader: str = "auto",
    min_agree: int = MIN_AGREE,
) -> dict[str, Any]:
    """Every flag, and which checks could not run (and why)."""
    flags = conflicting_duplicates(items, runs) + model_agreement(items, runs, min_agree=min_agree)
    skipped: dict[str, str] = {}
    if len(runs) < 2:
        skipped[AGREEMENT] = f"needs runs of at least 2 different models, got {len(runs)}"
    try:
        flags += unparsable_golds(items, grader)
    except ImportError:
        skipped[UNPARSABLE] = "the graders (evalstream.worker) are not installed here"
    suspects = sorted({s for f in flags for s in f.suspects})
    return {
        "items": len(items),
        "grader": grader,
        "models": sorted(runs),
        "counts": dict(Counter(f.kind for f in flags)),
        "suspects": suspects,
        "skipped": skipped,
        "flags": [asdict(f) for f in flags],
    }


# --------------------------------------------------------------------------- command


async def runs_by_model(
    conn: asyncpg.Connection, content_sha256: str, run_ids: list[str] | None
) -> tuple[dict[str, RunResults], dict[str, str], list[str]]:
    """(model -> results, model -> run id, graders used): the given runs, or every completed
    run on this dataset version; the newest run of each model."""
    if run_ids:
        rows = await conn.fetch(
            "SELECT run_id, model, grader, status, dataset_sha256, created_at FROM runs WHERE run_id = ANY($1::text[])",
            run_ids,
        )
        missing = set(run_ids) - {r["run_id"] for r in rows}
        if missing:
            raise LookupError(f"no run(s) {', '.join(sorted(missing))}")
        other = [r["run_id"] for r in rows if r["dataset_sha256"] != content_sha256]
        if other:
            raise LookupError(
                f"run(s) {', '.join(other)} were not on this dataset version ({content_sha256[:12]})"
            )
    else:
        rows = await conn.fetch(
            "SELECT run_id, model, grader, status, created_at FROM runs"
            " WHERE dataset_sha256 = $1 AND status = 'completed'",
            content_sha256,
        )
    newest: dict[str, asyncpg.Record] = {}
    for r in sorted(rows, key=lambda r: r["created_at"]):
        newest[r["model"]] = r
    results: dict[str, RunResults] = {}
    for model, r in newest.items():
        fetched = await conn.fetch(
            "SELECT item_id, extracted, correct, error FROM item_results WHERE run_id = $1", r["run_id"]
        )
        results[model] = {f["item_id"]: dict(f) for f in fetched}
    return results, {m: r["run_id"] for m, r in newest.items()}, sorted({r["grader"] for r in rows})


def print_audit(report: dict[str, Any], label: str) -> None:
    print(
        f"audit of {label}: {report['items']} items, grader {report['grader']}, {len(report['models'])} model(s)"
    )
    for kind, why in report["skipped"].items():
        print(f"  skipped {kind}: {why}")
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report["counts"].items())) or "no flags"
    print(f"  {counts}; {len(report['suspects'])} suspect item(s)")
    if not report["flags"]:
        return
    print(f"  {'kind':<26} {'suspects':<24} {'gold':<16} evidence")
    for f in report["flags"]:
        ev = f["evidence"]
        if f["kind"] == DUPLICATE:
            gold = " vs ".join(str(v) for v in ev["answers"].values())
            detail = f"same question: {ev['question'][:50]!r}"
        elif f["kind"] == AGREEMENT:
            gold = str(ev["gold"])
            detail = f"{ev['votes']}/{ev['models_answered']} models say {ev['agreed_answer']!r}"
        else:
            gold = str(ev["gold"])
            detail = f["message"] + (
                f" ({ev['numeric_golds_in_category']} numeric)" if "category" in ev else ""
            )
        print(f"  {f['kind']:<26} {','.join(f['suspects'])[:24]:<24} {gold[:16]:<16} {detail}")


async def cmd_audit(args: argparse.Namespace, settings: Settings) -> None:
    from evalstream.cli.datasets_cmd import DatasetRefError, load_ref
    from evalstream.cli.main import EXIT_REJECTED, fail, out_json

    run_ids = [r.strip() for r in (args.runs or "").split(",") if r.strip()] or None
    conn = await asyncpg.connect(settings.database_url)
    try:
        try:
            dataset = await load_ref(conn, settings, args.dataset)
            runs, run_of, graders = await runs_by_model(conn, dataset.content_sha256, run_ids)
        except (DatasetRefError, LookupError) as exc:
            fail(str(exc), EXIT_REJECTED)
    finally:
        await conn.close()
    grader = args.grader or (graders[0] if len(graders) == 1 else "auto")
    report = audit(dataset.items, runs, grader=grader, min_agree=args.min_agree)
    report = {"dataset": dataset.content_sha256, "runs": run_of, **report}
    if args.json:
        out_json(report)
    else:
        print_audit(report, f"{dataset.label} [{dataset.content_sha256[:12]}]")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    p = sub.add_parser(
        "audit",
        help="flag gold labels that look wrong (duplicates, model agreement, unparsable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dataset", required=True, help="dataset file or version (content hash prefix)")
    p.add_argument("--runs", help="comma-separated run ids (default: every completed run on this version)")
    p.add_argument("--grader", help="the dataset's grader SPEC (default: the runs' grader)")
    p.add_argument(
        "--min-agree", type=int, default=MIN_AGREE, help=f"models that must agree (default {MIN_AGREE})"
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON line")
    p.set_defaults(handler=cmd_audit)
