"""Log-likelihood scoring (the `loglikelihood` grader): lm-eval's `multiple_choice` and
`loglikelihood` output types, graded from the engine's per-choice scores (the response, JSON:
evalstream.common.scoring.ChoiceScores), with lm-eval 0.4.13's process_results rules.

Two or more choices: the pick is the choice of highest log-likelihood (acc: `correct`,
`score`), the pick per character the choice of highest log-likelihood divided by its length
in characters, the target delimiter not counted (acc_norm: `correct_norm`); ties go to the
first choice (numpy's argmax). One choice (a `loglikelihood` task such as lambada): right when
the continuation is the model's greedy one. `extracted` is the pick's text, `loglikelihood`
the gold choice's (a one-continuation run's perplexity is exp(-mean of it)).
"""

from __future__ import annotations

from evalstream.common import scoring
from evalstream.common.evidence import MAX_EVIDENCE_CHARS
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, GradingError, require

GRADER_VERSION = GRADER_VERSIONS["loglikelihood"]  # bump it there: run manifests record it


def _evidence_choice(text: str, ll: float, greedy: bool, tokens: int, clip: int) -> scoring.ChoiceEvidence:
    return scoring.ChoiceEvidence(
        text=text[:clip],
        chars=len(text),
        loglikelihood=ll,
        per_char=ll / len(text) if text else None,
        is_greedy=greedy,
        tokens=tokens,
    )


def loglikelihood() -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(scoring.loglikelihood_problem(item))
        choices = item.choices or []
        gold = scoring.gold_index(item)
        assert gold is not None  # loglikelihood_problem checked it
        try:
            scores = scoring.decode_choice_scores(response, len(choices))
        except ValueError as exc:
            raise GradingError(f"item {item.id}: {exc}") from None
        lls = scores.loglikelihoods
        pred = scoring.argmax(lls)
        one = len(choices) == 1
        # lm-eval: lls / completion_len, the length of the choice without the delimiter
        # (numpy divides by 0.0 into -inf/nan for an empty choice; the item check refuses one)
        pred_norm = (
            None if one else scoring.argmax([ll / max(1, len(c)) for ll, c in zip(lls, choices, strict=True)])
        )
        correct = scores.is_greedy[0] if one else pred == gold
        evidence = ""
        for clip in (scoring.MAX_EVIDENCE_CHOICE_CHARS, 40, 0):  # within the evidence's bound, whole
            evidence = scoring.encode_evidence(
                scoring.ScoreEvidence(
                    scoring="loglikelihood" if one else "multiple_choice",
                    target_delimiter=scoring.target_delimiter(item),
                    choices=[
                        _evidence_choice(c, ll, g, n, clip)
                        for c, ll, g, n in zip(choices, lls, scores.is_greedy, scores.tokens, strict=True)
                    ],
                    gold=gold,
                    pred=pred,
                    pred_norm=pred_norm,
                )
            )
            if len(evidence) <= MAX_EVIDENCE_CHARS:
                break
        if one:
            detail = None if correct else "the continuation is not the model's greedy one"
        else:
            detail = None if correct else f"expected choice {gold}, picked {pred}"
            detail = (detail + "; " if detail else "") + (
                f"acc_norm: picked {pred_norm}" + (" (right)" if pred_norm == gold else " (wrong)")
            )
        return Grade(
            extracted=choices[pred],
            correct=correct,
            score=float(correct),
            detail=detail,
            evidence=evidence if len(evidence) <= MAX_EVIDENCE_CHARS else None,
            correct_norm=None if one else pred_norm == gold,
            loglikelihood=lls[gold],
        )

    return grade
