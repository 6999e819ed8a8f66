"""`evalctl audit --dataset D [--runs R1,R2,...]`: gold labels that look wrong.

Three checks, each flag with its evidence:

* `conflicting_duplicate`: the same question (normalised: case, spacing, end punctuation;
  with the same choices) appears more than once with different gold answers. When runs are
  given, the items whose gold the models contradict are the suspects; otherwise all are.
* `models_disagree_with_gold`: the models' answers make the gold answer unlikely. By default
  (`--method reliability`) every item gets a score, the probability that its gold is wrong,
  from an EM that learns each model's accuracy (and, for multiple choice, its confusions) from
  the runs themselves, with the gold as one more annotator (evalstream.cli.reliability):
  an accurate model agreeing with the gold weighs more than a poor one disagreeing, and an item
  where no model agrees with the gold is suspect even when the models disagree among
  themselves. The cut (`--fdr`, default 0.1) flags as many of the highest-scoring items as
  keeps the flagged set's estimated share of false alarms, the mean of (1 - score) over it,
  at or under that rate (a Bayesian false discovery rate: the scores are posterior
  probabilities); `--threshold P` flags every item scoring P or more instead. Each flag
  carries the score, its q-value (the estimated false-alarm share of flagging down to it),
  who answered what, each model's estimated accuracy and a suggested gold. `--method majority` is the older
  rule: a strict majority of the models that answered, and at least `--min-agree` of them,
  agree on one answer that is not the gold. Several runs of one model count once (the
  newest), since a model agreeing with itself is no evidence; runs that answered only part of
  the set count where they answered.
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
from typing import Any

import asyncpg

from evalstream.cli.common import EXIT_REJECTED, database, fail, out_json
from evalstream.cli.datasets_cmd import DatasetRefError, load_ref
from evalstream.cli.reliability import CATEGORICAL, Estimate, Observation, estimate
from evalstream.common.gold import gold_letter, item_problem, letters_of, resolve_grader
from evalstream.common.graders import split_grader
from evalstream.common.messages import Item
from evalstream.common.settings import Settings

DUPLICATE = "conflicting_duplicate"
AGREEMENT = "models_disagree_with_gold"
UNPARSABLE = "unparsable_gold"
MIN_AGREE = 2
# The default cut: the largest set of top-scoring items whose estimated share of clean golds
# is at most this. A fixed score cut would flag too little where the estimate is unsure
# (scores of 0.2-0.5 that are mostly real errors) and ignore how many false alarms it buys.
MAX_FDR = 0.1
RELIABILITY, MAJORITY = "reliability", "majority"
CERTAIN = 1.0  # the score of the checks that need no estimate (duplicates, unparsable golds)
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
    score: float = CERTAIN  # how likely the suspects' gold is wrong; flags rank by it


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


def answer_kind(item: Item, grader: str) -> tuple[str, int | None]:
    """(answer kind, number of letters for multiple choice) of an item under `grader`, as
    the graders resolve "auto" (evalstream.common.gold)."""
    try:
        name = split_grader(resolve_grader(grader, item))[0]
    except ValueError:  # not a grader SPEC: a kind of its own
        name = grader.split(":", 1)[0]
    if name == CATEGORICAL:
        return CATEGORICAL, len(letters_of(item))
    return name, None


def observations(items: Sequence[Item], runs: Mapping[str, RunResults], grader: str) -> list[Observation]:
    """Each item with a gold answer and its models' answers, normalised for the estimator: a
    model the grader called right said the gold; a failed item is no answer; an answer the
    grader could not read is an unreadable one."""
    out = []
    for item in items:
        if item.answer is None:
            continue
        kind, options = answer_kind(item, grader)
        results = {m: r[item.id] for m, r in runs.items() if item.id in r and r[item.id].get("error") is None}
        gold = normalise(item.answer)
        if kind == CATEGORICAL and options:
            right = [
                str(r["extracted"]).upper()
                for r in results.values()
                if r.get("correct") and r.get("extracted")
            ]
            letter = right[0] if right else gold_letter(item)
            gold = letter if letter is not None else f"gold:{gold}"  # not a letter: an open item
        answers: dict[str, str | None] = {}
        for model, r in results.items():
            if r.get("correct"):
                answers[model] = gold
            elif r.get("extracted") is None:
                answers[model] = None
            else:
                said = str(r["extracted"]).upper() if kind == CATEGORICAL else normalise(str(r["extracted"]))
                answers[model] = said if said != gold else f"{said} (graded wrong)"
        out.append(Observation(item.id, gold, answers, kind, options))
    return out


def q_values(scores: Mapping[str, float]) -> dict[str, float]:
    """Item -> the estimated false discovery rate of flagging every item scoring at least as
    high: the mean of (1 - score) over them, made monotone (Storey's q-value, with posterior
    probabilities in place of p-values)."""
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    running, fdr = 0.0, []
    for k, (_, score) in enumerate(ranked, 1):
        running += 1.0 - score
        fdr.append(running / k)
    for k in range(len(fdr) - 2, -1, -1):  # a looser cut never looks better than a tighter one
        fdr[k] = min(fdr[k], fdr[k + 1])
    return {item_id: q for (item_id, _), q in zip(ranked, fdr, strict=True)}


def reliability_flags(
    items: Sequence[Item],
    runs: Mapping[str, RunResults],
    *,
    grader: str,
    threshold: float | None = None,
    max_fdr: float = MAX_FDR,
) -> tuple[list[Flag], Estimate]:
    """Flags by the reliability-aware estimate (evalstream.cli.reliability), and the estimate:
    the items whose q-value is at most `max_fdr`, or, given `threshold`, whose gold is wrong
    with at least that probability."""
    obs = observations(items, runs, grader)
    est = estimate(obs)
    q = q_values({o.item_id: est.scores[o.item_id] for o in obs if o.answers})
    gold_of = {i.id: i.answer for i in items}
    flags = []
    for o in obs:
        score = est.scores[o.item_id]
        if not o.answers or (q[o.item_id] > max_fdr if threshold is None else score < threshold):
            continue
        suggested, probability = est.suggested[o.item_id]
        shown = {m: runs[m][o.item_id].get("extracted") for m in sorted(o.answers)}
        votes = sum(a == suggested for a in o.answers.values()) if suggested is not None else 0
        agreeing = sum(a == o.gold for a in o.answers.values())
        flags.append(
            Flag(
                AGREEMENT,
                [o.item_id],
                [o.item_id],
                f"gold {gold_of[o.item_id]!r} is wrong with probability {score:.2f}: {agreeing} of "
                f"{len(o.answers)} models agree with it"
                + (f", {votes} answer {suggested!r}" if suggested is not None else ""),
                {
                    "gold": gold_of[o.item_id],
                    "suggested_gold": suggested,
                    "suggested_probability": round(probability, 4),
                    "votes": votes,
                    "models_answered": len(o.answers),
                    "models_agreeing_with_gold": agreeing,
                    "answers": shown,
                    "accuracy": {m: round(est.accuracy_by_kind[m][o.kind], 4) for m in shown},
                    "answer_kind": o.kind,
                    "q_value": round(q[o.item_id], 4),
                },
                round(score, 6),
            )
        )
    return flags, est


def unparsable_golds(items: Sequence[Item], grader: str) -> list[Flag]:
    """Items whose gold the grader cannot read, by the graders' own item checks."""
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
    method: str = RELIABILITY,
    threshold: float | None = None,
    max_fdr: float = MAX_FDR,
) -> dict[str, Any]:
    """Every flag, highest score first, and which checks could not run (and why). With the
    reliability method, also what it learned: each model's accuracy, the gold's, and every
    item's score; and the cut: `max_fdr` unless a score `threshold` is given."""
    flags = conflicting_duplicates(items, runs)
    skipped: dict[str, str] = {}
    learned: dict[str, Any] | None = None
    if len(runs) < 2:
        skipped[AGREEMENT] = f"needs runs of at least 2 different models, got {len(runs)}"
    elif method == MAJORITY:
        flags += model_agreement(items, runs, min_agree=min_agree)
    else:
        found, est = reliability_flags(items, runs, grader=grader, threshold=threshold, max_fdr=max_fdr)
        flags += found
        learned = {
            "accuracy": {m: round(a, 4) for m, a in est.accuracy.items()},
            "accuracy_by_kind": est.accuracy_by_kind,
            "gold_accuracy": round(est.gold_accuracy, 4),
            "coincidence": est.coincidence,
            "confusion": est.confusion,
            "iterations": est.iterations,
            "converged": est.converged,
            "scores": {i: round(p, 6) for i, p in est.scores.items()},
            # what the flags cost: the share of them expected to be clean golds
            "estimated_fdr": round(sum(1 - f.score for f in found) / len(found), 4) if found else None,
            # the lowest false-alarm share any cut reaches: what --fdr would need to flag anything
            "lowest_fdr": round(min(q_values(est.scores).values(), default=1.0), 4),
        }
    flags += unparsable_golds(items, grader)
    flags.sort(key=lambda f: -f.score)  # stable: equal scores keep the checks' order
    suspects = sorted({s for f in flags for s in f.suspects})
    return {
        "items": len(items),
        "grader": grader,
        "method": method,
        "threshold": threshold if method == RELIABILITY else None,
        "max_fdr": max_fdr if method == RELIABILITY and threshold is None else None,
        "models": sorted(runs),
        "counts": dict(Counter(f.kind for f in flags)),
        "suspects": suspects,
        "skipped": skipped,
        "reliability": learned,
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
    if learned := report.get("reliability"):
        models = ", ".join(f"{m} {a:.1%}" for m, a in learned["accuracy"].items())
        print(f"  estimated accuracy: {models}; gold labels {learned['gold_accuracy']:.1%}")
        if report["threshold"] is not None:
            print(f"  flagging items whose gold is wrong with probability >= {report['threshold']}")
        else:
            print(f"  flagging the most items whose estimated false-alarm share is <= {report['max_fdr']}")
        if learned["estimated_fdr"] is not None:
            print(f"  estimated share of false alarms among these flags: {learned['estimated_fdr']:.1%}")
        elif report["threshold"] is None:
            print(
                f"  no cut is that sure: the best reaches {learned['lowest_fdr']:.1%} false alarms "
                f"(flag at that rate with --fdr {min(1.0, learned['lowest_fdr'] + 0.05):.2f})"
            )
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report["counts"].items())) or "no flags"
    print(f"  {counts}; {len(report['suspects'])} suspect item(s)")
    if not report["flags"]:
        return
    print(f"  {'score':>5} {'kind':<26} {'suspects':<24} {'gold':<16} evidence")
    for f in report["flags"]:
        ev = f["evidence"]
        if f["kind"] == DUPLICATE:
            gold = " vs ".join(str(v) for v in ev["answers"].values())
            detail = f"same question: {ev['question'][:50]!r}"
        elif f["kind"] == AGREEMENT and "suggested_gold" in ev:
            gold = str(ev["gold"])
            said = ", ".join(f"{m} ({ev['accuracy'][m]:.0%}) {a!r}" for m, a in ev["answers"].items())
            suggested = ev["suggested_gold"]
            detail = (
                f"suggest {suggested!r} ({ev['suggested_probability']:.2f}); " if suggested else ""
            ) + said
        elif f["kind"] == AGREEMENT:
            gold = str(ev["gold"])
            detail = f"{ev['votes']}/{ev['models_answered']} models say {ev['agreed_answer']!r}"
        else:
            gold = str(ev["gold"])
            detail = f["message"] + (
                f" ({ev['numeric_golds_in_category']} numeric)" if "category" in ev else ""
            )
        suspects = ",".join(f["suspects"])[:24]
        print(f"  {f['score']:>5.2f} {f['kind']:<26} {suspects:<24} {gold[:16]:<16} {detail}")


async def audit_version(
    conn: asyncpg.Connection,
    settings: Settings,
    dataset_ref: str,
    run_ids: list[str] | None,
    *,
    grader: str | None = None,
    method: str = RELIABILITY,
    threshold: float | None = None,
    max_fdr: float = MAX_FDR,
    min_agree: int = MIN_AGREE,
) -> tuple[dict[str, Any], str]:
    """(the audit report of a dataset version with its runs, the dataset's label). Raises
    DatasetRefError or LookupError for a dataset or run that is not there."""

    dataset = await load_ref(conn, settings, dataset_ref)
    runs, run_of, graders = await runs_by_model(conn, dataset.content_sha256, run_ids)
    grader = grader or (graders[0] if len(graders) == 1 else "auto")
    report = audit(
        dataset.items,
        runs,
        grader=grader,
        min_agree=min_agree,
        method=method,
        threshold=threshold,
        max_fdr=max_fdr,
    )
    label = f"{dataset.label} [{dataset.content_sha256[:12]}]"
    return {"dataset": dataset.content_sha256, "runs": run_of, **report}, label


async def cmd_audit(args: argparse.Namespace, settings: Settings) -> None:

    run_ids = [r.strip() for r in (args.runs or "").split(",") if r.strip()] or None
    async with database(settings) as conn:
        try:
            report, label = await audit_version(
                conn,
                settings,
                args.dataset,
                run_ids,
                grader=args.grader,
                method=args.method,
                threshold=args.threshold,
                max_fdr=args.fdr,
                min_agree=args.min_agree,
            )
        except (DatasetRefError, LookupError) as exc:
            fail(str(exc), EXIT_REJECTED)
    if args.json:
        out_json(report)
    else:
        print_audit(report, label)


async def accuracy_without_flagged(
    conn: asyncpg.Connection,
    settings: Settings,
    run_id: str,
    *,
    threshold: float | None = None,
    max_fdr: float = MAX_FDR,
) -> dict[str, Any]:
    """For `evalctl report --exclude-flagged`: the run's accuracy over the items the audit of
    its dataset version (every completed run on it, this one included) does not flag, beside
    the raw figure; a failed item scores 0 in both, as in the report."""
    run = await conn.fetchrow("SELECT dataset_sha256, total FROM runs WHERE run_id = $1", run_id)
    if run is None:
        raise LookupError(f"no run {run_id}")
    rows = await conn.fetch("SELECT item_id, score FROM item_results WHERE run_id = $1", run_id)
    completed = await conn.fetch(
        "SELECT run_id FROM runs WHERE dataset_sha256 = $1 AND status = 'completed'", run["dataset_sha256"]
    )
    run_ids = sorted({r["run_id"] for r in completed} | {run_id})
    report, _ = await audit_version(
        conn, settings, run["dataset_sha256"], run_ids, threshold=threshold, max_fdr=max_fdr
    )
    total = run["total"] or len(rows)
    flagged = set(report["suspects"])
    score = {r["item_id"]: float(r["score"] or 0.0) for r in rows}
    kept = total - len(flagged)
    return {
        "threshold": threshold,
        "max_fdr": report["max_fdr"],
        "models": report["models"],
        "flagged": len(flagged),
        "skipped": report["skipped"],
        "accuracy": round(sum(score.values()) / total, 6) if total else None,
        "accuracy_excluding_flagged": (
            round(sum(v for i, v in score.items() if i not in flagged) / kept, 6) if kept > 0 else None
        ),
    }


def probability(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a probability between 0 and 1")
    return value


def add_cut_arguments(p: argparse.ArgumentParser) -> None:
    """--fdr and --threshold: where the reliability audit cuts (audit, report --exclude-flagged)."""
    p.add_argument(
        "--fdr",
        type=probability,
        default=MAX_FDR,
        help="reliability: flag the most items whose estimated share of false alarms stays at or "
        f"under this rate (default {MAX_FDR})",
    )
    p.add_argument(
        "--threshold",
        type=probability,
        help="reliability: instead of --fdr, flag every item whose gold is wrong with at least this probability",
    )


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
        "--method",
        choices=(RELIABILITY, MAJORITY),
        default=RELIABILITY,
        help="how model answers flag a gold: learned model reliability (default) or a majority vote",
    )
    add_cut_arguments(p)
    p.add_argument(
        "--min-agree",
        type=int,
        default=MIN_AGREE,
        help=f"majority: models that must agree (default {MIN_AGREE})",
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON line")
    p.set_defaults(handler=cmd_audit)
