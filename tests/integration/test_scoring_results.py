"""Scoring results in PostgreSQL (issue 24): the worker's graded results of a log-likelihood
run, written by the aggregator's own store (migration 007's columns, through RESULT_COLUMNS),
summarised with lm-eval's metrics (acc, acc_norm with stderr and 95 % intervals; perplexities
of a rolling run), and read back for the item page's table of choices."""

from __future__ import annotations

import json
import math

import asyncpg
import pytest

from evalstream.aggregator.store import ResultStore, Sourced, source_of
from evalstream.common import db, scoring
from evalstream.common.analysis import items, items_html
from evalstream.common.analysis.reports import summarise
from evalstream.common.messages import Item, ItemResult
from evalstream.common.settings import Settings
from evalstream.worker.grading import get_grader
from tests.support import admin_database_url, service_database_url, unique

pytestmark = pytest.mark.stack


def graded(run_id: str, item: Item, grader: str, response: str) -> ItemResult:
    g = get_grader(grader)(response, item)
    return ItemResult(
        run_id=run_id, item_id=item.id, shard_id=f"{run_id}-s0", response=response, extracted=g.extracted,
        correct=None if g.ungraded else g.correct, score=g.score, evidence=g.evidence, detail=g.detail, question=item.question,
        correct_norm=g.correct_norm, loglikelihood=g.loglikelihood, doc_words=g.doc_words, doc_bytes=g.doc_bytes,
    )  # fmt: skip


def choice_scores(lls: list[float]) -> str:
    return scoring.encode_scores(
        scoring.ChoiceScores(loglikelihoods=lls, is_greedy=[False] * len(lls), tokens=[1] * len(lls))
    )


async def store_run(
    stack: Settings, pg: asyncpg.Connection, run_id: str, grader: str, results: list[ItemResult]
) -> None:
    await db.migrate(admin_database_url())  # 007 on a stack made before it (the owner's job)
    await pg.execute(
        "INSERT INTO runs (run_id, status, model, grader, spec, total) VALUES ($1, 'running', 'null', $2, $3, $4)",
        run_id,
        grader,
        json.dumps({}),
        len(results),
    )
    pool = await db.create_pool(service_database_url("aggregator"))  # the aggregator's own store
    try:
        async with pool.acquire() as conn, conn.transaction():
            await ResultStore(pool).write(
                conn, [Sourced(r, source_of("eval.results", 0, i)) for i, r in enumerate(results)]
            )
    finally:
        await pool.close()


async def test_a_multiple_choice_run_is_summarised_with_acc_and_acc_norm(
    stack: Settings, pg_admin: asyncpg.Connection
) -> None:
    run_id = unique("scores")
    item = Item(id="", question="Q:", choices=["red", "a table", "blue-green"], answer="2")
    # per item (lls): acc right?, acc_norm right?
    cases = [
        ([-1.0, -5.0, -2.0], False, True),
        ([-3.0, -5.0, -2.0], True, True),
        ([-1.0, -1.5, -9.0], False, False),
        ([-4.0, -9.0, -1.0], True, True),
    ]
    results = [
        graded(run_id, _item(item, f"i{i}"), "loglikelihood", choice_scores(lls))
        for i, (lls, _, _) in enumerate(cases)
    ]
    assert [(r.correct, r.correct_norm) for r in results] == [(a, n) for _, a, n in cases]
    try:
        await store_run(stack, pg_admin, run_id, "loglikelihood", results)
        rows = await pg_admin.fetch(
            "SELECT item_id, correct_norm, loglikelihood, doc_words FROM item_results WHERE run_id = $1 ORDER BY item_id",
            run_id,
        )
        assert [(r["correct_norm"], r["loglikelihood"], r["doc_words"]) for r in rows] == [
            (n, lls[2], None) for lls, _, n in cases
        ]
        summary = await summarise(pg_admin, run_id)
        s = summary["scores"]
        assert s["acc"]["value"] == 0.5 and s["acc_norm"]["value"] == 0.75 and s["acc"]["n"] == 4
        assert s["acc"]["stderr"] == pytest.approx(math.sqrt(0.25 / 3), abs=1e-6)
        lo, hi = s["acc_norm"]["ci95"]
        assert lo < 0.75 < hi <= 1.0
        assert summary["accuracy"] == 0.5
        item_row = await items.one_item(pg_admin, run_id, "i0")
        assert item_row is not None
        page = items_html.item_sections(item_row)
        assert "id='choices'" in page and "blue-green" in page and "acc_norm pick" in page
    finally:
        await pg_admin.execute("DELETE FROM item_results WHERE run_id = $1", run_id)
        await pg_admin.execute("DELETE FROM runs WHERE run_id = $1", run_id)


def _item(template: Item, item_id: str) -> Item:
    return Item(id=item_id, question=template.question, choices=template.choices, answer=template.answer)


async def test_a_perplexity_run_reports_lm_evals_weighted_perplexities(
    stack: Settings, pg_admin: asyncpg.Connection
) -> None:
    run_id = unique("ppl")
    docs = {"d1": ("one two three four", -20.0), "d2": ("fünf sechs", -9.5)}
    results = [
        graded(
            run_id,
            Item(id=k, question=text),
            "perplexity",
            scoring.encode_scores(scoring.RollingScore(loglikelihood=ll, tokens=5)),
        )
        for k, (text, ll) in docs.items()
    ]
    try:
        await store_run(stack, pg_admin, run_id, "perplexity", results)
        summary = await summarise(pg_admin, run_id)
        s = summary["scores"]
        words, n_bytes = 4 + 2, len(b"one two three four") + len("fünf sechs".encode())
        assert (s["documents"], s["words"], s["bytes"]) == (2, words, n_bytes)
        assert s["word_perplexity"] == pytest.approx(math.exp(29.5 / words))
        assert s["byte_perplexity"] == pytest.approx(math.exp(29.5 / n_bytes))
        assert s["bits_per_byte"] == pytest.approx(29.5 / n_bytes / math.log(2))
        assert summary["accuracy"] is None  # nothing in a perplexity run is right or wrong
    finally:
        await pg_admin.execute("DELETE FROM item_results WHERE run_id = $1", run_id)
        await pg_admin.execute("DELETE FROM runs WHERE run_id = $1", run_id)
