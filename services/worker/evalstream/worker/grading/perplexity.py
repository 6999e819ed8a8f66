"""Perplexity (the `perplexity` grader): lm-eval's `loglikelihood_rolling` output type. The
response is the document's rolling log-likelihood (evalstream.common.scoring.RollingScore);
the grade records it with the document's words and UTF-8 bytes, lm-eval's weights of
word_perplexity, byte_perplexity and bits_per_byte, which the run's summary aggregates. There
is nothing to be right about: the grade is `ungraded` (the result's `correct` is None, the item
browser's "ungraded"), `score` 0.
"""

from __future__ import annotations

import math

from evalstream.common import scoring
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, GradingError, require

GRADER_VERSION = GRADER_VERSIONS["perplexity"]  # bump it there: run manifests record it


def perplexity() -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(scoring.perplexity_problem(item))
        document = item.question or ""
        try:
            score = scoring.decode_rolling_score(response)
        except ValueError as exc:
            raise GradingError(f"item {item.id}: {exc}") from None
        words, n_bytes = scoring.count_words(document), scoring.count_bytes(document)
        evidence = scoring.ScoreEvidence(
            scoring="loglikelihood_rolling",
            loglikelihood=score.loglikelihood,
            tokens=score.tokens,
            words=words,
            bytes=n_bytes,
        )
        word_ppl = math.exp(min(700.0, -score.loglikelihood / words))
        return Grade(
            extracted=None,
            correct=False,
            ungraded=True,
            score=0.0,
            detail=f"word perplexity {word_ppl:.6g} over {words} words",
            evidence=scoring.encode_evidence(evidence),
            loglikelihood=score.loglikelihood,
            doc_words=words,
            doc_bytes=n_bytes,
        )

    return grade
