"""The reader against lm-eval 0.4.13 itself, live: lm-eval (in bench/.venv-lmeval, created as
bench/harness/venvs.py creates it, sharing the project's torch) builds the requests of its own
task YAMLs in tests/lmeval_tasks with its TaskManager and `build_all_requests`; the reader's
items must give the same contexts, continuations, gold answers and generation settings, byte
for byte, and the recording the fast test uses (expected.json) must still be lm-eval's. Then
lm-eval's RegexFilter, take_first and exact_match on a set of responses against
evalstream.common.lmeval_filters and the worker's `lm_eval` grader.

Slow: the first run installs lm-eval into its venv (about 2 minutes, from PyPI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from evalstream.common.lmeval import read_tasks
from evalstream.common.lmeval_filters import detail_results, grade
from evalstream.worker.grading import get_grader
from tests.lmeval_tasks import fidelity

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lmeval_venv() -> Path:
    sys.path.insert(0, str(ROOT))
    from bench.harness.venvs import ensure_lmeval_venv

    ensure_lmeval_venv()
    return fidelity.LMEVAL_PYTHON


@pytest.fixture(scope="module")
def dump(lmeval_venv: Path) -> dict[str, Any]:
    return fidelity.run_lmeval(list(fidelity.TASKS))


@pytest.mark.parametrize("name", list(fidelity.TASKS))
def test_items_are_lm_evals_requests(name: str, dump: dict[str, Any]) -> None:
    path, shots = fidelity.TASKS[name]
    [task] = read_tasks(
        fidelity.TASKS_DIR / path, root=fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, num_fewshot=shots
    )
    ours = fidelity.canonical_from_items(task)
    theirs = fidelity.canonical_from_dump(dump[name])
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a == b, f"{name} document {i} differs"
    recorded = json.loads(fidelity.EXPECTED.read_text(encoding="utf-8"))[name]
    assert recorded["sha256"] == fidelity.digest(theirs), "expected.json is stale: run fidelity.py record"


@pytest.mark.parametrize("group", list(fidelity.GROUPS))
def test_a_groups_tasks_are_lm_evals(group: str, lmeval_venv: Path) -> None:
    theirs = fidelity.run_lmeval([group])
    tasks = read_tasks(fidelity.TASKS_DIR / fidelity.GROUPS[group], data_dir=fidelity.DATA_DIR)
    assert sorted(t.name for t in tasks) == sorted(theirs)
    for t in tasks:
        assert fidelity.canonical_from_items(t) == fidelity.canonical_from_dump(theirs[t.name]), t.name


def test_another_seed_gives_lm_evals_other_contexts(lmeval_venv: Path) -> None:
    theirs = fidelity.canonical_from_dump(fidelity.run_lmeval(["arc_easy"], seed=42)["arc_easy"])
    path, shots = fidelity.TASKS["arc_easy"]
    [task] = read_tasks(
        fidelity.TASKS_DIR / path,
        root=fidelity.TASKS_DIR,
        data_dir=fidelity.DATA_DIR,
        num_fewshot=shots,
        fewshot_seed=42,
    )
    assert fidelity.canonical_from_items(task) == theirs


LMEVAL_FILTERS = """
import json, sys
from lm_eval.filters.extraction import RegexFilter
from lm_eval.filters.selection import TakeFirstFilter
from lm_eval.api.metrics import exact_match_hf_evaluate
case = json.load(sys.stdin)
out = []
for response, gold in case["responses"]:
    row = []
    for pipeline in case["filters"]:
        resps = [[response]]
        for step in pipeline["filter"]:
            if step["function"] == "regex":
                kw = {k: v for k, v in step.items() if k != "function"}
                resps = list(RegexFilter(**kw).apply(resps, [{}]))
            else:
                resps = list(TakeFirstFilter().apply(resps, [{}]))
        extracted = resps[0]
        em = exact_match_hf_evaluate(predictions=[extracted], references=[gold], **case["options"])["exact_match"]
        row.append([extracted, bool(em)])
    out.append(row)
print(json.dumps(out))
"""


def test_filters_and_exact_match_are_lm_evals(lmeval_venv: Path) -> None:
    tasks = {t.name: t for t in read_tasks(fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, limit=1)}
    responses = [
        ("The answer: 72.\n#### 72", "72"),
        (" She earns $1,200 in all.\n#### 1,200\n\nQuestion: next", "1200"),
        ("#### -3.5 and then #### 4", "-3.5"),
        ("no numbers", "5"),
        ("Let's see: 12 + 30 = 42. So 42", "42"),
        ("Yes.", "Yes"),
        ("no, it does not", "No"),
        ("", "Yes"),
        ("   Yes  ", "Yes"),
        ('"No" \\ ,', "No"),
        ("<think>#### 5</think>\n#### 7", "5"),  # the raw answer: nothing stripped
        ("Ｙｅｓ — héllo wörld, yes. 12,5 ٣", "Yes"),  # non-ASCII: Python's engine for \b
    ]
    for name in ("gsm8k", "bbh_zeroshot_navigate"):
        meta = tasks[name].items[0].meta
        assert meta is not None
        lm = meta["lm_eval"]
        options = {k: v for k, v in lm["metric"].items() if k != "metric"}
        case = {"filters": lm["filters"], "options": options, "responses": responses}
        proc = subprocess.run(
            [str(lmeval_venv), "-c", LMEVAL_FILTERS],
            input=json.dumps(case),
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        theirs = json.loads(proc.stdout)
        ours = [[[g.extracted, g.correct] for g in grade(r, lm, gold)] for r, gold in responses]
        assert ours == theirs, name
        # the worker's grader: its RE2/deadline-bounded patterns, every pipeline in the detail
        worker = get_grader("lm_eval")
        kept = [
            detail_results(worker(r, msgspec.structs.replace(tasks[name].items[0], answer=gold)).detail) or []
            for r, gold in responses
        ]
        assert [[[k.extracted, k.correct] for k in row] for row in kept] == theirs, name
