"""`evalctl submit --task` on the running stack: lm-eval's gsm8k YAML (tests/lmeval_tasks, 4
documents, the `null` model) becomes a run whose items are the reader's, ids lm-eval's
doc_ids, whose generation settings are the YAML's, whose prompts are raw, and whose manifest
holds the task's YAML with its hash; `evalctl reproduce` reruns it with the same manifest.
Answers written here (a `replay:` model) are graded by the `lm_eval` grader exactly as
lm-eval's RegexFilter, take_first and exact_match grade them, each filter reported. A
multiple-choice task runs too where the worker scores log-likelihoods."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from evalstream.common import storage
from evalstream.common.lmeval import read_tasks
from evalstream.common.lmeval_filters import detail_results, grade
from evalstream.common.manifest import request_from_manifest
from evalstream.common.regrading import run_items
from evalstream.common.settings import Settings
from tests.e2e.helpers import evalctl, result_rows
from tests.lmeval_tasks import fidelity
from tests.replay_files import replay_dir

pytestmark = pytest.mark.stack

GSM8K = fidelity.TASKS_DIR / "gsm8k" / "gsm8k.yaml"


def submit_task(*args: str, timeout: float = 600) -> dict[str, Any]:
    proc = evalctl(
        "submit", "--task", *args, "--wait", "--json", "--timeout", str(timeout), timeout=timeout + 60
    )
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["stderr"] = proc.stderr
    return summary


async def manifest_of(conn: asyncpg.Connection, run_id: str) -> dict[str, Any]:
    raw = await conn.fetchval("SELECT manifest FROM runs WHERE run_id = $1", run_id)
    assert raw is not None
    manifest: dict[str, Any] = json.loads(raw)
    return manifest


async def test_a_generation_task_runs_with_its_yaml_in_the_manifest(stack: Settings) -> None:
    summary = submit_task(str(GSM8K), "--data-dir", str(fidelity.DATA_DIR), "--model", "null", "--limit", "4")
    assert summary["status"] == "completed" and summary["total"] == 4 and summary["task"] == "gsm8k"
    assert summary["grader"] == "lm_eval" and "warning" not in summary["stderr"]
    [task] = read_tasks(GSM8K, data_dir=fidelity.DATA_DIR, limit=4)
    conn = await asyncpg.connect(stack.database_url)
    try:
        rows = await result_rows(conn, summary["run_id"])
        assert sorted(r["item_id"] for r in rows) == ["0", "1", "2", "3"]  # lm-eval's doc_ids
        manifest = await manifest_of(conn, summary["run_id"])
    finally:
        await conn.close()
    stored = run_items(storage.client(stack), request_from_manifest(manifest))  # the dataset copy
    assert stored == task.items
    assert manifest["task"]["name"] == "gsm8k"
    assert manifest["task"]["files"][0]["path"] == "gsm8k.yaml"
    assert manifest["task"]["files"][0]["text"] == GSM8K.read_text()
    assert manifest["task"]["sha256"] == task.source.sha256
    assert manifest["generation"]["stop"] == ["Question:", "</s>", "<|im_end|>"]
    assert manifest["prompt"]["raw"] is True  # lm-eval's context as it is
    assert [r["prompt"] for r in rows] == [i.question for i in task.items]

    proc = evalctl("reproduce", summary["run_id"], "--wait", "--json", "--timeout", "600", timeout=660)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["items"] == 4
    assert report["manifest_sha256"]["identical"], report["manifest_sha256"]


def gsm8k_answer(index: int, gold: str) -> str:
    """Answers that tell lm-eval's two gsm8k filters apart: (strict-match, flexible-extract)
    right for 0: (yes, yes), 1: (no, yes), 2: (no, no), 3: (yes, no)."""
    return [
        f"Adding it up gives {gold} in all.\n#### {gold}",
        f"So the answer is {gold}.",  # no "####"; flexible reads "<gold>." and ignores the period
        f"#### {int(gold.replace(',', '')) + 1}",
        f"<think>#### {gold}</think>\nOn second thought:\n#### -1",  # the raw answer: think block kept
    ][index % 4]


async def test_gsm8k_is_graded_as_lm_eval_grades_it(stack: Settings) -> None:
    [task] = read_tasks(GSM8K, data_dir=fidelity.DATA_DIR, limit=8)
    golds = {i.id: (i.answer or "").split("#### ")[-1] for i in task.items}
    answers = [{"id": i.id, "response": gsm8k_answer(int(i.id), golds[i.id])} for i in task.items]
    replay = replay_dir("lmeval") / "gsm8k.jsonl"
    replay.write_text("".join(json.dumps(a) + "\n" for a in answers))
    summary = submit_task(
        str(GSM8K), "--data-dir", str(fidelity.DATA_DIR), "--model", f"replay:{replay}", "--limit", "8"
    )
    assert summary["status"] == "completed" and summary["failed"] == 0 and summary["grader"] == "lm_eval"
    # by hand: strict-match is right on answers 0 and 3 of every four, flexible-extract on 0 and 1
    strict, flexible = summary["scores"]["filters"]
    assert (strict["name"], flexible["name"]) == ("strict-match", "flexible-extract")
    assert strict["exact_match"]["value"] == 0.5 == summary["accuracy"]
    assert flexible["exact_match"]["value"] == 0.5
    assert strict["exact_match"]["n"] == flexible["exact_match"]["n"] == 8
    conn = await asyncpg.connect(stack.database_url)
    try:
        rows = {r["item_id"]: r for r in await result_rows(conn, summary["run_id"])}
    finally:
        await conn.close()
    for item, answer in zip(task.items, answers, strict=True):
        row = rows[item.id]
        # lm-eval's RegexFilter + take_first + exact_match (checked against lm-eval itself in
        # tests/unit/test_lmeval_fidelity.py), on the raw answer
        expected = grade(answer["response"], item.meta["lm_eval"], item.answer or "")  # type: ignore[index]
        assert (row["extracted"], row["correct"]) == (expected[0].extracted, expected[0].correct), item.id
        kept = detail_results(row["detail"]) or []
        assert [(r.name, r.extracted, r.correct) for r in kept] == [
            (e.name, e.extracted, e.correct) for e in expected
        ]
        assert [e.correct for e in expected] == [int(item.id) % 4 in (0, 3), int(item.id) % 4 in (0, 1)]
        assert row["response"] == answer["response"] and row["prompt"] == item.question


async def test_a_refused_task_uploads_nothing(stack: Settings) -> None:
    proc = evalctl("submit", "--task", str(fidelity.HERE / "refused/wikitext/wikitext.yaml"), check=False)
    assert proc.returncode == 2
    assert "doc_to_target: !function preprocess_wikitext.wikitext_detokenizer" in proc.stderr


async def test_a_multiple_choice_task_is_scored(stack: Settings) -> None:
    path, _ = fidelity.TASKS["arc_easy"]
    summary = submit_task(
        str(fidelity.TASKS_DIR / path),
        "--data-dir",
        str(fidelity.DATA_DIR),
        "--model",
        "hf:smollm2-135m-instruct",
        "--limit",
        "3",
    )
    assert summary["status"] == "completed" and summary["total"] == 3 and summary["failed"] == 0
