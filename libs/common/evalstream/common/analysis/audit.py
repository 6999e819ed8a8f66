"""The label audit's checks, pure (audit_runs.py reads the runs they need; `evalctl audit`
prints them, with what follows as its help).

Three checks, each flag with its evidence:

* `conflicting_duplicate`: the same question (normalised: case, spacing, end punctuation;
  with the same choices) appears more than once with different gold answers. When runs are
  given, the items whose gold the models contradict are the suspects; otherwise all are.
* `models_disagree_with_gold`: the models' answers make the gold answer unlikely. By default
  (`--method reliability`) every item gets a score, the probability that its gold is wrong,
  from an EM that learns each model's accuracy (and, for multiple choice, its confusions) from
  the runs themselves, with the gold as one more annotator (evalstream.common.analysis.reliability):
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

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from evalstream.common.analysis.questions import normalise, question_key
from evalstream.common.analysis.reliability import CATEGORICAL, Estimate, Observation, estimate
from evalstream.common.gold import gold_letter, item_problem, letters_of, resolve_grader
from evalstream.common.graders import split_grader
from evalstream.common.messages import Item

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
            groups[question_key(item)].append(item)
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
    """Flags by the reliability-aware estimate (analysis.reliability), and the estimate:
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
