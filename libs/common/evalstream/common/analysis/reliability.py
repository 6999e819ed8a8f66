"""How likely each gold label is to be wrong, given every model's answer and how reliable each
model is: a Dawid–Skene-style EM in which the gold label is one more annotator.

Pure (numpy, no I/O): `estimate(observations)` -> `Estimate`.

Why Dawid–Skene and not a majority vote or confident learning
-------------------------------------------------------------
A majority vote counts models as equals and looks only at the answers that disagree with the
gold, so an item where fewer than two models happen to be right is invisible to it. Confident
learning (Northcutt et al. 2021) needs one probability per *class* from a classifier, and
per-class thresholds: it has nothing to hold on to for numeric and free-text answers, whose
"classes" differ from item to item. Dawid & Skene (1979) model each annotator's reliability and
infer the true label of every item from all annotators at once, by EM; with the gold label as an
annotator of its own (reliability `gold_accuracy`, learned too), the posterior probability that
the truth is *not* the gold answer is exactly "how unlikely the gold is given every model's
answer". On a clean item the accurate models agree with the gold; on a mislabelled one almost
none does, whatever they answer, and an accurate model weighs more than a poor one. The EM needs
no labelled data, works with any number of models of two or more (with the gold that is three
annotators, enough to identify one-coin reliabilities), and a model that did not answer an item
(a partial run, a failed item) simply says nothing about it.

The model
---------
Every item has a latent true answer z. Each annotator a (the models, and the gold) says z with
probability acc_a, otherwise something else.

* Open answers (numeric, free text: whatever the grader extracted, normalised): a wrong answer is
  drawn from a diffuse distribution over all possible answers, and hits any one given value with
  probability `coincidence` (delta: how often two wrong answers happen to be equal, learned per
  answer kind, since wrong numbers collide more than wrong sentences). The truth is drawn from the
  same distribution. The candidates for z are the values seen (the gold and each distinct model
  answer) and "something nobody said". Up to a common factor,

      w(c) = delta * prod_{a says c} acc_a / ((1 - acc_a) * delta),      w(nobody said) = 1,

  so one annotator alone for c gives its odds acc/(1-acc); every further one that agrees
  multiplies by odds/delta (agreeing by chance is unlikely). Accuracy is learned per (model,
  answer kind), shrunk towards the model's overall accuracy where an answer kind has few items.
* Categorical answers (multiple choice letters): the classic Dawid–Skene model. Each model has a
  confusion matrix P(says b | truth c) over letters (a model that always answers the letter after
  the right one is learned as such, and then even tells the truth), smoothed towards its one-coin
  accuracy; the truth has a prior over letters; the gold is right with `gold_accuracy`, otherwise
  any other letter.

An unreadable answer (the grader found none) counts as wrong in the accuracies but says nothing
about which candidate is true. The score of an item is P(z != gold | everything), the
suggested gold the most probable other candidate (None when the most probable is an answer
nobody gave).

Assumptions worth knowing: models err independently given the truth (models that share a
misconception inflate each other; the coincidence rate partly absorbs it), and items are
equally hard.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import numpy.typing as npt

CATEGORICAL = "choice"  # the answer kind of categorical items
MAX_ITERATIONS = 200
TOLERANCE = 1e-6
PSEUDO_ITEMS = 5.0  # how many items' worth of weight each prior carries
ACC_FLOOR, ACC_CEIL = 1e-3, 1 - 1e-3
GOLD_FLOOR = 0.5  # a gold label worse than a coin flip is no gold label
PRIOR_ACCURACY, PRIOR_GOLD, PRIOR_COINCIDENCE = 0.7, 0.9, 0.05
COINCIDENCE_FLOOR, COINCIDENCE_CEIL = 1e-4, 0.5
MISSING, UNREADABLE = -2, -1  # codes in the answer matrices

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Observation:
    """One item: its gold answer and what each model answered, all normalised the grader's way.

    `answers`: model -> the normalised answer (equal to `gold` when the grader said correct), or
    None when the model answered but nothing could be read; a model that did not answer the item
    is absent. `kind`: the answer kind (numeric, exact, ...): wrong answers collide at a rate of
    their own. `options`: for a categorical item (kind CATEGORICAL), how many letters it has; its
    gold and answers are then letters "A", "B", ...
    """

    item_id: str
    gold: str
    answers: Mapping[str, str | None]
    kind: str = "exact"
    options: int | None = None


@dataclass
class Estimate:
    scores: dict[str, float]  # item id -> P(the gold answer is wrong)
    suggested: dict[str, tuple[str | None, float]]  # item id -> (most probable other answer, its P)
    accuracy: dict[str, float]  # model -> estimated accuracy over all its answers
    accuracy_by_kind: dict[str, dict[str, float]]  # model -> answer kind -> accuracy
    gold_accuracy: float
    coincidence: dict[str, float]  # answer kind -> P(two wrong answers are equal)
    confusion: dict[str, list[list[float]]] = field(default_factory=dict)  # categorical, per model
    iterations: int = 0
    converged: bool = False


def _letter_index(answer: str | None, options: int) -> int:
    if answer is None:
        return UNREADABLE
    index = ord(answer.strip().upper()[:1] or "?") - ord("A")
    return index if 0 <= index < options else UNREADABLE


def _logit(p: FloatArray) -> FloatArray:
    return np.asarray(np.log(p) - np.log1p(-p), dtype=np.float64)


def _softmax_rows(logw: FloatArray) -> FloatArray:
    logw = logw - logw.max(axis=1, keepdims=True)
    w = np.exp(logw)
    return np.asarray(w / w.sum(axis=1, keepdims=True), dtype=np.float64)


class _Open:
    """Open items as padded arrays: candidate 0 is the gold, the last column "nobody said"."""

    def __init__(self, obs: Sequence[Observation], models: list[str], kinds: list[str]) -> None:
        self.ids = [o.item_id for o in obs]
        self.n, self.m = len(obs), len(models)
        self.width = self.m + 2
        self.other = self.width - 1
        self.kind = np.array([kinds.index(o.kind) for o in obs], dtype=np.int64)
        self.answers = np.full((self.n, self.m), MISSING, dtype=np.int64)
        self.valid = np.zeros((self.n, self.width), dtype=bool)
        self.valid[:, 0] = self.valid[:, self.other] = True
        self.values: list[list[str]] = []
        for i, o in enumerate(obs):
            values = [o.gold]
            for j, model in enumerate(models):
                if model not in o.answers:
                    continue
                said = o.answers[model]
                if said is None:
                    self.answers[i, j] = UNREADABLE
                    continue
                if said not in values:
                    values.append(said)
                self.answers[i, j] = values.index(said)
            self.valid[i, : len(values)] = True
            self.values.append(values)

    def posterior(self, acc: FloatArray, gold_acc: float, delta: FloatArray) -> FloatArray:
        log_delta = np.log(delta[self.kind])
        logw = np.where(self.valid, log_delta[:, None], -np.inf)
        logw[:, self.other] = 0.0
        logw[:, 0] += math.log(gold_acc / (1 - gold_acc)) - log_delta
        rows = np.arange(self.n)
        for j in range(self.m):
            said = self.answers[:, j] >= 0
            gain = _logit(acc[j, self.kind]) - log_delta
            logw[rows[said], self.answers[said, j]] += gain[said]
        return _softmax_rows(logw)

    def accuracy_counts(self, post: FloatArray, n_kinds: int) -> tuple[FloatArray, FloatArray]:
        right = np.zeros((self.m, n_kinds))
        answered = np.zeros((self.m, n_kinds))
        rows = np.arange(self.n)
        for j in range(self.m):
            said = self.answers[:, j]
            np.add.at(answered[j], self.kind[said != MISSING], 1.0)
            ok = said >= 0
            np.add.at(right[j], self.kind[ok], post[rows[ok], said[ok]])
        return right, answered

    def coincidence_counts(self, post: FloatArray, n_kinds: int) -> tuple[FloatArray, FloatArray]:
        """Expected (both wrong and equal, both wrong) over pairs of annotators, the gold included."""
        said = np.concatenate([np.zeros((self.n, 1), dtype=np.int64), self.answers], axis=1)
        rows = np.arange(self.n)
        equal_wrong = np.zeros(n_kinds)
        both_wrong = np.zeros(n_kinds)
        for a, b in combinations(range(said.shape[1]), 2):
            ok = (said[:, a] >= 0) & (said[:, b] >= 0)
            ia, ib = said[ok, a], said[ok, b]
            pa, pb = post[rows[ok], ia], post[rows[ok], ib]
            same = ia == ib
            np.add.at(equal_wrong, self.kind[ok], np.where(same, 1 - pa, 0.0))
            np.add.at(both_wrong, self.kind[ok], np.where(same, 1 - pa, 1 - pa - pb))
        return equal_wrong, both_wrong


class _Categorical:
    """Categorical items: letters 0..options-1, the gold one of them."""

    def __init__(self, obs: Sequence[Observation], models: list[str]) -> None:
        self.ids = [o.item_id for o in obs]
        self.n, self.m = len(obs), len(models)
        self.options = np.array([o.options or 0 for o in obs], dtype=np.int64)
        self.k = int(self.options.max()) if self.n else 2
        self.gold = np.array([_letter_index(o.gold, o.options or 0) for o in obs], dtype=np.int64)
        self.answers = np.full((self.n, self.m), MISSING, dtype=np.int64)
        for i, o in enumerate(obs):
            for j, model in enumerate(models):
                if model in o.answers:
                    self.answers[i, j] = _letter_index(o.answers[model], o.options or 0)
        self.valid = np.arange(self.k)[None, :] < self.options[:, None]

    def posterior(self, confusion: FloatArray, prior: FloatArray, gold_acc: float) -> FloatArray:
        logw = np.where(self.valid, np.log(prior)[None, :], -np.inf)
        wrong_gold = np.log((1 - gold_acc) / np.maximum(self.options - 1, 1))
        is_gold = np.arange(self.k)[None, :] == self.gold[:, None]
        logw += np.where(is_gold, math.log(gold_acc), wrong_gold[:, None])
        for j in range(self.m):
            said = self.answers[:, j] >= 0
            # P(says b | c) renormalised over the item's own letters
            mass = np.cumsum(confusion[j], axis=1)  # [c, K-1] = sum over the first K letters
            norm = np.log(mass[:, self.options[said] - 1].T)  # (items, c)
            logw[said] += np.log(confusion[j][:, self.answers[said, j]].T) - norm
        return _softmax_rows(logw)

    def confusion_counts(self, post: FloatArray) -> FloatArray:
        counts = np.zeros((self.m, self.k, self.k))
        for j in range(self.m):
            said = self.answers[:, j] >= 0
            for b in range(self.k):
                counts[j, :, b] += post[said & (self.answers[:, j] == b)].sum(axis=0)
        return counts

    def accuracy_counts(self, post: FloatArray) -> tuple[FloatArray, FloatArray]:
        rows = np.arange(self.n)
        right = np.zeros(self.m)
        answered = np.zeros(self.m)
        for j in range(self.m):
            said = self.answers[:, j]
            answered[j] = float((said != MISSING).sum())
            ok = said >= 0
            right[j] = float(post[rows[ok], said[ok]].sum())
        return right, answered


def _one_coin(acc: float, k: int) -> FloatArray:
    m = np.full((k, k), (1 - acc) / max(k - 1, 1))
    np.fill_diagonal(m, acc)
    return m


def estimate(observations: Sequence[Observation]) -> Estimate:
    """Scores every observed item. Categorical items whose gold is not one of their letters are
    treated as open items (the gold then matches no answer, as the grader said)."""
    models = sorted({m for o in observations for m in o.answers})
    categorical = [
        o
        for o in observations
        if o.kind == CATEGORICAL and o.options and o.options >= 2 and _letter_index(o.gold, o.options) >= 0
    ]
    chosen = {id(o) for o in categorical}
    open_obs = [o for o in observations if id(o) not in chosen]
    kinds = sorted({o.kind for o in open_obs} | ({CATEGORICAL} if categorical else set()))
    op = _Open(open_obs, models, kinds)
    cat = _Categorical(categorical, models)
    m, n_kinds, ci = len(models), len(kinds), kinds.index(CATEGORICAL) if categorical else -1

    acc = np.full((m, n_kinds), PRIOR_ACCURACY)
    gold_acc = PRIOR_GOLD
    delta = np.full(n_kinds, PRIOR_COINCIDENCE)
    confusion = np.stack([_one_coin(PRIOR_ACCURACY, cat.k) for _ in range(m)]) if m else np.zeros((0, 2, 2))
    letter_prior = np.full(cat.k, 1 / cat.k)
    iterations, converged = 0, False
    post_open = np.zeros((0, op.width))
    post_cat = np.zeros((0, cat.k))
    for iterations in range(1, MAX_ITERATIONS + 1):  # noqa: B007 (reported)
        # E-step: the posterior over each item's candidates
        post_open = op.posterior(acc, gold_acc, delta) if op.n else np.zeros((0, op.width))
        post_cat = cat.posterior(confusion, letter_prior, gold_acc) if cat.n else np.zeros((0, cat.k))

        # M-step: reliabilities from the posteriors, each shrunk towards its prior
        right, answered = op.accuracy_counts(post_open, n_kinds)
        if cat.n:
            r, a = cat.accuracy_counts(post_cat)
            right[:, ci] += r
            answered[:, ci] += a
        overall = (right.sum(axis=1) + PSEUDO_ITEMS * PRIOR_ACCURACY) / (answered.sum(axis=1) + PSEUDO_ITEMS)
        new_acc = (right + PSEUDO_ITEMS * overall[:, None]) / (answered + PSEUDO_ITEMS)
        new_acc = np.clip(new_acc, ACC_FLOOR, ACC_CEIL)

        gold_right = float(post_open[:, 0].sum()) + float(post_cat[np.arange(cat.n), cat.gold].sum())
        n_items = op.n + cat.n
        new_gold = (gold_right + PSEUDO_ITEMS * PRIOR_GOLD) / (n_items + PSEUDO_ITEMS)
        new_gold = min(max(new_gold, GOLD_FLOOR), ACC_CEIL)

        equal_wrong, both_wrong = op.coincidence_counts(post_open, n_kinds)
        new_delta = (equal_wrong + PSEUDO_ITEMS * PRIOR_COINCIDENCE) / (both_wrong + PSEUDO_ITEMS)
        new_delta = np.clip(new_delta, COINCIDENCE_FLOOR, COINCIDENCE_CEIL)

        new_confusion = confusion
        if cat.n:
            counts = cat.confusion_counts(post_cat)
            towards = np.stack([_one_coin(float(new_acc[j, ci]), cat.k) for j in range(m)])
            new_confusion = (counts + PSEUDO_ITEMS * towards) / (
                counts.sum(axis=2, keepdims=True) + PSEUDO_ITEMS
            )
            new_confusion = np.clip(new_confusion, ACC_FLOOR, None)
            new_confusion /= new_confusion.sum(axis=2, keepdims=True)
            letter_prior = (post_cat.sum(axis=0) + PSEUDO_ITEMS / cat.k) / (cat.n + PSEUDO_ITEMS)

        change = max(
            float(np.abs(new_acc - acc).max(initial=0.0)),
            abs(new_gold - gold_acc),
            float(np.abs(new_delta - delta).max(initial=0.0)),
            float(np.abs(new_confusion - confusion).max(initial=0.0)),
        )
        acc, gold_acc, delta, confusion = new_acc, new_gold, new_delta, new_confusion
        if change < TOLERANCE:
            converged = True
            break

    scores: dict[str, float] = {}
    suggested: dict[str, tuple[str | None, float]] = {}
    for i, item_id in enumerate(op.ids):
        p = post_open[i]
        scores[item_id] = float(1 - p[0])
        others = np.where(op.valid[i, 1:], p[1:], -1.0)
        best = int(np.argmax(others)) + 1
        value = None if best == op.other else op.values[i][best]
        suggested[item_id] = (value, float(p[best]))
    for i, item_id in enumerate(cat.ids):
        p = post_cat[i]
        scores[item_id] = float(1 - p[cat.gold[i]])
        others = np.where(cat.valid[i] & (np.arange(cat.k) != cat.gold[i]), p, -1.0)
        best = int(np.argmax(others))
        suggested[item_id] = (chr(ord("A") + best), float(p[best]))

    right, answered = op.accuracy_counts(post_open, n_kinds)
    if cat.n:
        r, a = cat.accuracy_counts(post_cat)
        right[:, ci] += r
        answered[:, ci] += a
    return Estimate(
        scores=scores,
        suggested=suggested,
        accuracy={
            model: float(right[j].sum() / answered[j].sum()) if answered[j].sum() else float("nan")
            for j, model in enumerate(models)
        },
        accuracy_by_kind={
            model: {kind: float(acc[j, k]) for k, kind in enumerate(kinds) if answered[j, k]}
            for j, model in enumerate(models)
        },
        gold_accuracy=float(gold_acc),
        coincidence={kind: float(delta[k]) for k, kind in enumerate(kinds) if kind != CATEGORICAL},
        confusion={model: confusion[j].round(4).tolist() for j, model in enumerate(models)} if cat.n else {},
        iterations=iterations,
        converged=converged,
    )
