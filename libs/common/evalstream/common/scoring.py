"""Log-likelihood scoring, as lm-evaluation-harness (0.4.13) scores most of its tasks: what
the worker's scoring graders, the run summaries and the item browser share.

Two graders score instead of generating (evalstream.common.graders; "auto" never picks them):

* `loglikelihood`: lm-eval's `multiple_choice` and `loglikelihood` output types. The item's
  `question` is the whole raw context (few-shot examples included; no chat template, system
  prompt or prompt template is applied), its `choices` the continuations without the target
  delimiter, its `answer` the gold choice's index ("2"). Each choice is scored as the
  log-likelihood of `target_delimiter + choice` given the context (`meta.lm_eval.target_delimiter`,
  default " "). With two or more choices: acc = the choice of highest log-likelihood is the gold
  one, acc_norm = the same per character of the choice (lm-eval divides by len(choice), the
  delimiter not counted; ties go to the first choice, as numpy's argmax). With one choice
  (lm-eval's `loglikelihood` output type, e.g. lambada): acc = the continuation is the greedy
  one, and the run's perplexity = exp(-mean log-likelihood).
* `perplexity`: lm-eval's `loglikelihood_rolling`. The item's `question` is the document; its
  log-likelihood is computed over lm-eval's rolling token windows; the run reports
  word_perplexity = exp(-sum LL / sum words), byte_perplexity = exp(-sum LL / sum bytes) and
  bits_per_byte = -sum LL / sum bytes / ln 2 (lm-eval's weighted_perplexity and bits_per_byte,
  words counted as len(re.split(r"\\s+", doc)), bytes in UTF-8).

The engine's scores are the item's `response`, as JSON (ChoiceScores or RollingScore): a
regrade grades them again without a model. The grader's reading of them is the result's
`evidence` (ScoreEvidence, JSON), which the item browser shows as a table of choices.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from evalstream.common.messages import Item

LOGLIKELIHOOD = "loglikelihood"
PERPLEXITY = "perplexity"
SCORING_GRADERS = frozenset({LOGLIKELIHOOD, PERPLEXITY})
DEFAULT_TARGET_DELIMITER = " "  # lm-eval's TaskConfig.target_delimiter
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval
MAX_EVIDENCE_CHOICE_CHARS = 200  # of a choice's text in the evidence (the item keeps it whole)


# --------------------------------------------------------------------------- engine scores


class ChoiceScores(msgspec.Struct, frozen=True, kw_only=True):
    """A `loglikelihood` item's response: per choice, in the item's order."""

    loglikelihoods: list[float]
    is_greedy: list[bool]
    tokens: list[int]  # continuation tokens scored


class RollingScore(msgspec.Struct, frozen=True, kw_only=True):
    """A `perplexity` item's response: the document's rolling log-likelihood."""

    loglikelihood: float
    tokens: int  # tokens scored (the whole document's)


_encoder = msgspec.json.Encoder()
_choice_decoder = msgspec.json.Decoder(ChoiceScores)
_rolling_decoder = msgspec.json.Decoder(RollingScore)


def encode_scores(scores: ChoiceScores | RollingScore) -> str:
    """The response text (floats written so that they read back bit for bit)."""
    return _encoder.encode(scores).decode()


def decode_choice_scores(response: str, choices: int) -> ChoiceScores:
    """Raises ValueError for a response that is not the scores of `choices` choices."""
    try:
        scores = _choice_decoder.decode(response)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the response is not a log-likelihood record: {exc}") from None
    lengths = {len(scores.loglikelihoods), len(scores.is_greedy), len(scores.tokens)}
    if lengths != {choices}:
        raise ValueError(f"the response scores {sorted(lengths)} choices, the item has {choices}")
    if any(math.isnan(x) or x > 0 for x in scores.loglikelihoods):
        raise ValueError("a log-likelihood is NaN or positive")
    return scores


def decode_rolling_score(response: str) -> RollingScore:
    try:
        score = _rolling_decoder.decode(response)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the response is not a rolling log-likelihood record: {exc}") from None
    if math.isnan(score.loglikelihood) or score.loglikelihood > 0 or score.tokens < 0:
        raise ValueError("the log-likelihood is NaN or positive")
    return score


# --------------------------------------------------------------------------- items


def lm_eval_meta(item: Item) -> dict[str, Any]:
    meta = (item.meta or {}).get("lm_eval")
    return meta if isinstance(meta, dict) else {}


def target_delimiter(item: Item) -> str:
    value = lm_eval_meta(item).get("target_delimiter", DEFAULT_TARGET_DELIMITER)
    return value if isinstance(value, str) else DEFAULT_TARGET_DELIMITER


def continuations(item: Item) -> list[str]:
    """What is scored after the context, per choice: the target delimiter and the choice."""
    delimiter = target_delimiter(item)
    return [delimiter + choice for choice in item.choices or []]


def gold_index(item: Item) -> int | None:
    """The gold choice: a decimal index ("2"), else the exact text of a choice (as lm-eval
    reads a string target); None when it is neither."""
    gold = (item.answer or "").strip()
    choices = item.choices or []
    if gold.isdigit() and int(gold) < len(choices):
        return int(gold)
    return choices.index(item.answer) if item.answer in choices else None


def loglikelihood_problem(item: Item, _argument: str | None = None) -> str | None:
    if item.messages:
        return f"item {item.id}: log-likelihood scoring needs a raw context in `question`, not `messages`"
    if item.question is None:
        return f"item {item.id}: log-likelihood scoring needs the context in `question`"
    if not item.choices:
        return f"item {item.id}: log-likelihood scoring needs the continuations in `choices`"
    if not isinstance(lm_eval_meta(item).get("target_delimiter", ""), str):
        return f"item {item.id}: meta.lm_eval.target_delimiter must be a string"
    if any(not c for c in continuations(item)):
        return f"item {item.id}: an empty continuation (empty choice, empty target delimiter)"
    if gold_index(item) is None:
        return f"item {item.id}: gold answer {item.answer!r} is not the index of one of {len(item.choices)} choices"
    return None


def perplexity_problem(item: Item, _argument: str | None = None) -> str | None:
    if item.messages or not item.question:
        return f"item {item.id}: perplexity needs the document in `question`"
    return None


def count_words(text: str) -> int:
    """lm-eval's Task.count_words."""
    return len(re.split(r"\s+", text))


def count_bytes(text: str) -> int:
    """lm-eval's Task.count_bytes."""
    return len(text.encode("utf-8"))


def argmax(values: list[float]) -> int:
    """The first index of the largest value (numpy's argmax)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


# --------------------------------------------------------------------------- evidence


class ChoiceEvidence(msgspec.Struct, frozen=True, kw_only=True):
    text: str  # the choice, clipped to MAX_EVIDENCE_CHOICE_CHARS
    chars: int  # its length, lm-eval's acc_norm divisor
    loglikelihood: float
    per_char: float | None  # loglikelihood / chars (None for an empty choice)
    is_greedy: bool
    tokens: int


class ScoreEvidence(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a scoring grader read, for the item browser (the result's `evidence`)."""

    scoring: str  # "multiple_choice", "loglikelihood" (one continuation) or "loglikelihood_rolling"
    target_delimiter: str | None = None
    choices: list[ChoiceEvidence] | None = None
    gold: int | None = None
    pred: int | None = None  # by log-likelihood (acc)
    pred_norm: int | None = None  # by log-likelihood per character (acc_norm)
    loglikelihood: float | None = None  # rolling: the document's
    tokens: int | None = None
    words: int | None = None
    bytes: int | None = None


_evidence_decoder = msgspec.json.Decoder(ScoreEvidence)


def encode_evidence(evidence: ScoreEvidence) -> str:
    return _encoder.encode(evidence).decode()


def read_evidence(text: str | None) -> ScoreEvidence | None:
    """A result's evidence as a scoring grader wrote it, or None (another grader's, or none)."""
    if not text or not text.startswith('{"scoring"'):
        return None
    try:
        return _evidence_decoder.decode(text)
    except msgspec.DecodeError:
        return None


# --------------------------------------------------------------------------- run metrics


def mean_with_interval(successes: float, n: int) -> dict[str, Any]:
    """The mean of n values in [0, 1] summing to `successes`, lm-eval's standard error of a
    binary metric (sample standard deviation / sqrt(n): sqrt(p(1-p)/(n-1))) and the normal
    95 % interval mean ± 1.96 stderr, clipped to [0, 1]."""
    if n <= 0:
        return {"value": None, "stderr": None, "ci95": None, "n": 0}
    p = successes / n
    stderr = math.sqrt(max(0.0, p * (1 - p)) / (n - 1)) if n > 1 else None
    ci = None
    if stderr is not None:
        ci = [round(max(0.0, p - Z95 * stderr), 6), round(min(1.0, p + Z95 * stderr), 6)]
    return {
        "value": round(p, 6),
        "stderr": round(stderr, 6) if stderr is not None else None,
        "ci95": ci,
        "n": n,
    }


def perplexity_of_mean(sum_loglikelihood: float, n: int) -> float | None:
    """lm-eval's `perplexity` aggregation: exp(-mean log-likelihood)."""
    return _exp(-sum_loglikelihood / n) if n > 0 else None


def rolling_metrics(sum_loglikelihood: float, words: int, n_bytes: int) -> dict[str, float | None]:
    """lm-eval's word_perplexity, byte_perplexity (weighted_perplexity) and bits_per_byte."""
    return {
        "word_perplexity": _exp(-sum_loglikelihood / words) if words > 0 else None,
        "byte_perplexity": _exp(-sum_loglikelihood / n_bytes) if n_bytes > 0 else None,
        "bits_per_byte": -sum_loglikelihood / n_bytes / math.log(2) if n_bytes > 0 else None,
    }


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else math.inf
