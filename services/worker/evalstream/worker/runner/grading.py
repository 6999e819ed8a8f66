"""Grading the runner's answers: string graders on untrusted text in the grading pool's
processes under a per-item deadline (or inline where a runner has no pool: tests of the
runner alone), graders that run programs or wait on a model in threads; and the result row
each graded item becomes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from evalstream.common import evidence
from evalstream.common.messages import ItemResult
from evalstream.worker.engines.base import EngineError
from evalstream.worker.grading import get_grader
from evalstream.worker.grading.base import Grade
from evalstream.worker.grading_pool import GradeTask, GradingPool, GradingUnavailable
from evalstream.worker.runner.items import Answered, Failure, Stored
from evalstream.worker.sandbox import SandboxUnavailable

if TYPE_CHECKING:
    from evalstream.worker.runner.model_runner import ModelRunner

GRADING_THREADS = 8
# Graders that run programs or wait on a model go to threads; the rest is string work on
# untrusted text, done in the grading pool's processes under a per-item deadline (or inline
# where a runner has no pool: tests of the runner alone).
BLOCKING_GRADERS = frozenset({"code", "judge"})


def grade_all(runner: ModelRunner, answered: list[Answered]) -> tuple[list[ItemResult], list[Failure]]:
    """Every answer graded: string graders in the runner's grading pool (inline where it has
    none), those that run programs or wait on a model in a few threads."""
    blocking = [e for e in answered if e[0].grader.split(":", 1)[0] in BLOCKING_GRADERS]
    strings = [e for e in answered if e[0].grader.split(":", 1)[0] not in BLOCKING_GRADERS]
    group = runner.config.group
    if runner.grading is None:
        graded = [grade_one(group, e) for e in strings]
    else:
        graded = grade_in_pool(group, runner.grading, strings)
    if blocking:
        # a few threads: code runs in sandbox processes and a judge waits on its model
        if runner.grading_threads is None:
            runner.grading_threads = ThreadPoolExecutor(GRADING_THREADS, thread_name_prefix="grading")
        graded += runner.grading_threads.map(partial(grade_one, group), blocking)
    return [g for g in graded if isinstance(g, ItemResult)], [g for g in graded if isinstance(g, Failure)]


def grade_in_pool(group: str, pool: GradingPool, entries: list[Answered]) -> list[ItemResult | Failure]:
    """Graded in the pool's processes. A reply's error (a grader that failed, overran its
    deadline or crashed) fails its item for good: the same answer would do it again."""
    tasks = [GradeTask(e[0].grader, e[1].response, e[0].item) for e in entries]
    try:
        replies = pool.grade(tasks)
    except GradingUnavailable as exc:  # this worker's fault: another attempt may go elsewhere
        return [Failure(e[0].shard, e[0].item, f"{type(exc).__name__}: {exc}", True) for e in entries]
    return [
        result(group, e, r.grade)
        if r.grade is not None
        else Failure(e[0].shard, e[0].item, r.error or "", False)
        for e, r in zip(entries, replies, strict=True)
    ]


def grade_one(group: str, entry: Answered) -> ItemResult | Failure:
    p, answer = entry[0], entry[1]
    try:
        # Graders clean what they read themselves (think blocks, fences): cleaning here
        # would strip a code body's first-line indentation.
        grade = get_grader(p.grader, p.item)(answer.response, p.item)
    except EngineError as exc:  # a judge's model failed: retried like the item's own
        return Failure(p.shard, p.item, f"{type(exc).__name__}: {exc}", exc.transient)
    except SandboxUnavailable as exc:  # this worker's fault: another attempt may go elsewhere
        return Failure(p.shard, p.item, f"{type(exc).__name__}: {exc}", True)
    except Exception as exc:  # an item that cannot be graded must not sink its shard
        return Failure(p.shard, p.item, f"{type(exc).__name__}: {exc}", False)
    return result(group, entry, grade)


def result(group: str, entry: Answered, grade: Grade) -> ItemResult:
    """The item's result row, served by `group`."""
    p, answer, latency_ms, cache_hit, truncated = entry
    if isinstance(p, Stored):  # a regrade: only the grade is new
        served_by, revision, attempts, prompt = (
            p.answer.served_by, p.answer.model_revision, p.answer.attempts, p.answer.prompt
        )  # fmt: skip
    else:
        served_by, revision = f"{group}/{p.engine.name}", p.engine.revision
        attempts, prompt = p.shard.attempt, p.prompt
    return ItemResult(
        run_id=p.shard.run_id,
        item_id=p.item.id,
        shard_id=p.shard.shard_id,
        response=answer.response,
        extracted=grade.extracted,
        correct=None if grade.ungraded else grade.correct,
        score=grade.score,
        attempts=attempts,
        cache_hit=cache_hit,
        latency_ms=latency_ms,
        served_by=served_by,
        model_revision=revision,
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        truncated=truncated,
        category=p.item.category,
        question=evidence.question_of(p.item),
        gold=evidence.gold_of(p.item),
        prompt=evidence.clip(prompt, evidence.MAX_PROMPT_CHARS),
        detail=evidence.clip(grade.detail, evidence.MAX_DETAIL_CHARS),
        evidence=evidence.clip(grade.evidence, evidence.MAX_EVIDENCE_CHARS),
        correct_norm=grade.correct_norm,
        loglikelihood=grade.loglikelihood,
        doc_words=grade.doc_words,
        doc_bytes=grade.doc_bytes,
    )
