"""How the label audit (bench/label_audit.py) is scored and shown: ranking metrics against the
planted errors, the grid's tables and the README's text."""

from __future__ import annotations

from typing import Any

TARGET_RECALL, TARGET_PRECISION = 0.95, 0.85
README_START, README_END = "<!-- label-audit:start -->", "<!-- label-audit:end -->"


def average_precision(scores: dict[str, float], positives: set[str]) -> float:
    """Mean of the precision at each planted error's rank; items tied on a score share their
    block's precision (no tie-breaking in either method's favour)."""
    if not positives:
        return 0.0
    by_score: dict[float, list[str]] = {}
    for item_id, s in scores.items():
        by_score.setdefault(s, []).append(item_id)
    seen = hits = 0
    total = 0.0
    for s in sorted(by_score, reverse=True):
        block = by_score[s]
        block_hits = sum(i in positives for i in block)
        # expected precision over the positives of a tied block, taken in random order
        for k in range(1, block_hits + 1):
            rank = seen + k * (len(block) + 1) / (block_hits + 1)
            total += (hits + k) / rank
        seen += len(block)
        hits += block_hits
    return total / len(positives)


def best_recall_at(scores: dict[str, float], positives: set[str], precision: float) -> float:
    """The highest recall of any cut of the ranking (between distinct scores) with at least
    `precision`."""
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    best, hits = 0.0, 0
    for k, (item_id, s) in enumerate(ranked, 1):
        hits += item_id in positives
        if (k == len(ranked) or ranked[k][1] != s) and hits / k >= precision:
            best = max(best, hits / len(positives))
    return best


def recall_precision(found: set[str], positives: set[str]) -> tuple[float, float | None]:
    """Precision is None when nothing is flagged."""
    hits = len(found & positives)
    return (hits / len(positives) if positives else 0.0), (hits / len(found) if found else None)


def f1(recall: float, precision: float | None) -> float:
    return 2 * recall * precision / (recall + precision) if precision and recall + precision else 0.0


def fmt_metrics(m: dict[str, Any] | None) -> str:
    if m is None:
        return "–"
    precision = "–" if m["precision"] is None else f"{m['precision']:.2f}"
    return f"{m['recall']:.2f} / {precision} / {m['ap']:.2f}"


def meets_goal(m: dict[str, Any]) -> bool:
    return bool(m["recall"] >= TARGET_RECALL and (m["precision"] or 0) >= TARGET_PRECISION)


def markdown(cells: list[dict[str, Any]]) -> str:
    """The README table: one row per (models, mean accuracy), one column per error rate; each
    cell "recall / precision / AP" of ours, then the majority vote's."""
    rates = sorted({c["error_rate"] for c in cells})
    head = " | ".join(f"{r:.0%} errors: ours R / P / AP · majority R / P / AP" for r in rates)
    lines = [f"| models | mean acc. | {head} |", "|---|---|" + "---|" * len(rates)]
    by_key = {(c["models"], c["accuracy"], c["error_rate"]): c for c in cells}
    for models, accuracy in sorted({(c["models"], c["accuracy"]) for c in cells}):
        row = []
        for rate in rates:
            c = by_key.get((models, accuracy, rate))
            if c is None:
                row.append("–")
                continue
            o, m = c["ours"], c["majority"]
            met = models >= 3 and accuracy >= 0.70 and meets_goal(o)
            ceiling = o.get("oracle_recall_at_p85")
            row.append(
                f"{f'**{fmt_metrics(o)}**' if met else fmt_metrics(o)} · {fmt_metrics(m)}"
                + (f" · ceiling {ceiling:.2f}" if ceiling is not None else "")
            )
        lines.append(f"| {models} | {accuracy:.0%} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def choice_markdown(cells: list[dict[str, Any]]) -> str:
    """The multiple-choice items alone, with cleanlab where it ran: average precision of the
    rankings, recall / precision of the flags."""
    lines = [
        "| error rate | models | mean acc. | planted | ours R / P / AP | majority R / P / AP | cleanlab R / P / AP |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        ci = c["choice_items"]
        lines.append(
            f"| {c['error_rate']:.0%} | {c['models']} | {c['accuracy']:.0%} | {ci['planted']} "
            f"| {fmt_metrics(ci['ours'])} | {fmt_metrics(ci['majority'])} | {fmt_metrics(ci.get('cleanlab'))} |"
        )
    return "\n".join(lines)


def readme_body(doc: dict[str, Any], max_fdr: float) -> str:
    """`max_fdr`: the audit's default cut (estimated FDR), as the text states it."""
    cl = doc["cleanlab"]
    cleanlab = (
        f"cleanlab {cl['version']}"
        if "version" in cl
        else f"cleanlab not run ({cl.get('error') or cl.get('skipped')})"
    )
    goals = "; ".join(f"{g['benchmark']}: {g['measured']}" for g in doc["goals"])
    return "\n".join(
        [
            f"Measured {doc['finished_at'][:16].replace('T', ' ')} by `bench/label_audit.py` in {doc['wall_s']:.0f} s "
            f"({doc['items_per_set']} items per set, seed {doc['seed']}; {cleanlab}; raw numbers in "
            f"`bench/results/label_audit.json`). Each cell: recall / precision at the default cut (estimated FDR ≤ {max_fdr}) "
            "/ average precision of the ranking, ours (`--method reliability`) · the majority vote "
            "(`--method majority`); bold: the goal (R ≥ 0.95 at P ≥ 0.85) met where it applies. "
            "Where the goal applies, *ceiling*: the best recall at P ≥ 0.85 that any scorer can reach "
            "from the answers, measured by ranking a large set by the generator's own frequency of "
            "planted errors for each answer pattern (`oracle_ceiling`).",
            "",
            f"Goals: {goals}.",
            "",
            doc["table"],
            "",
            "The multiple-choice third alone, where cleanlab applies (one class per letter):",
            "",
            doc["choice_table"],
        ]
    )
