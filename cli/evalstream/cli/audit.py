"""`evalctl audit --dataset D [--runs R1,R2,...]`: gold labels that look wrong (the checks
and their reading: evalstream.common.analysis.audit, audit_runs)."""

from __future__ import annotations

import argparse
from typing import Any

from evalstream.cli.common import EXIT_REJECTED, add_cut_arguments, database, fail, out_json
from evalstream.common.analysis import audit
from evalstream.common.analysis.audit import AGREEMENT, DUPLICATE, MAJORITY, MIN_AGREE, RELIABILITY
from evalstream.common.analysis.audit_runs import audit_version
from evalstream.common.analysis.versions import DatasetRefError
from evalstream.common.settings import Settings

# the command's help: its first line, then the checks as the library describes them
HELP = (
    "`evalctl audit --dataset D [--runs R1,R2,...]`: gold labels that look wrong.\n\n"
    + ((audit.__doc__ or "").split("\n\n", 1)[1])
)


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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    p = sub.add_parser(
        "audit",
        help="flag gold labels that look wrong (duplicates, model agreement, unparsable)",
        description=HELP,
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
