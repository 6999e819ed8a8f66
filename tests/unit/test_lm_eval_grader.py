"""The `lm_eval` grader (lm-eval's filters and exact_match on a generate_until task's answer):
the worker's grader on lm-eval's own task YAMLs (gsm8k, bbh navigate) equals the shared
library's lm-eval functions run with Python's `re` (tests/unit/test_lmeval_fidelity.py checks
those against lm-eval 0.4.13 live), the response is read raw, every pipeline is kept for the
run summary, the item check refuses what cannot be graded, and a task's hostile pattern is
bounded like any user pattern."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import pytest

from evalstream.common.analysis.reports import filter_scores
from evalstream.common.evidence import MAX_DETAIL_CHARS
from evalstream.common.gold import item_problem, resolve_grader
from evalstream.common.graders import AUTO_GRADERS, grader_problem, grader_version
from evalstream.common.lmeval import RenderedTask, read_tasks
from evalstream.common.lmeval_filters import (
    FilteredGrade,
    detail_results,
    encode_detail,
    filter_counts,
    grade,
)
from evalstream.common.messages import Item
from evalstream.worker.grading import get_grader
from evalstream.worker.grading.patterns import compile_pattern
from evalstream.worker.grading_pool import GradeTask, GradingPool
from tests.degenerate import DEGENERATE
from tests.lmeval_tasks import fidelity

RESPONSES = [
    "The answer: 72.\n#### 72",
    " She earns $1,200 in all.\n#### 1,200\n\nQuestion: next",
    "#### -3.5 and then #### 4",
    "no numbers",
    "Let's see: 12 + 30 = 42. So 42",
    "<think>\n#### 5\n</think>\n#### 7",  # not cleaned: lm-eval reads the think block too
    "```\n#### 18\n```",
    "Yes.",
    "no, it does not",
    "",
    "   Yes  ",
    '"No" \\ ,',
    "Ｙｅｓ — héllo wörld 12,5 ٣",  # non-ASCII: the Unicode-sensitive patterns run in Python's engine
]


@pytest.fixture(scope="module")
def tasks() -> dict[str, RenderedTask]:
    found = read_tasks(fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, limit=3)
    return {t.name: t for t in found if t.output_type == "generate_until"}


def test_the_grader_is_lm_evals_functions_on_lm_evals_own_yamls(tasks: dict[str, RenderedTask]) -> None:
    assert {"gsm8k", "bbh_zeroshot_navigate", "bbh_fewshot_navigate"} <= set(tasks)
    grader = get_grader("lm_eval")
    for task in tasks.values():
        for item in task.items:
            assert item_problem("lm_eval", item) is None
            meta = item.meta["lm_eval"]  # type: ignore[index]
            for response in [*RESPONSES, item.answer or ""]:
                expected = grade(response, meta, item.answer or "")  # Python's re, as lm-eval's
                got = grader(response, item)
                assert (got.extracted, got.correct, got.score) == (
                    expected[0].extracted,
                    expected[0].correct,
                    float(expected[0].correct),
                ), (task.name, response)
                assert detail_results(got.detail) is not None
                kept = detail_results(got.detail) or []
                assert [(r.name, r.extracted, r.correct) for r in kept] == [
                    (e.name, e.extracted, e.correct) for e in expected
                ]


def test_gsm8k_is_graded_as_lm_eval_grades_it(tasks: dict[str, RenderedTask]) -> None:
    item = tasks["gsm8k"].items[0]  # Janet's ducks: #### 18
    assert item.answer is not None and item.answer.endswith("#### 18")
    grader = get_grader("lm_eval")

    def both(response: str) -> list[tuple[str, str, bool]]:
        return [(r.name, r.extracted, r.correct) for r in detail_results(grader(response, item).detail) or []]

    # strict-match: the first "#### n"; flexible-extract: the last number; $ and , ignored
    assert both("She sells 9 eggs for $18.\n#### 18") == [
        ("strict-match", "18", True),
        ("flexible-extract", "18", True),
    ]
    assert both("9 * 2 = $18 a day") == [
        ("strict-match", "[invalid]", False),
        ("flexible-extract", "$18", True),
    ]
    assert both("#### 1,8") == [("strict-match", "1,8", True), ("flexible-extract", "1,8", True)]
    # the raw response: a think block is not stripped (evalstream's regex grader would)
    assert both("<think>#### 9</think>\n#### 18")[0] == ("strict-match", "9", False)
    result = grader("#### 18", item)
    assert (result.extracted, result.correct, result.score) == ("18", True, 1.0)


def test_auto_never_picks_it_and_the_manifest_names_its_version() -> None:
    assert "lm_eval" not in AUTO_GRADERS and grader_problem("lm_eval") is None
    assert grader_problem("lm_eval:x") is not None  # takes no argument
    assert grader_version("lm_eval") == "lm_eval/1 clean/1"
    item = Item(id="1", question="q", answer="18", meta={"lm_eval": {}})
    assert resolve_grader("auto", item) == "numeric"


@pytest.mark.parametrize(
    ("meta", "words"),
    [
        (None, "no meta.lm_eval"),
        ({"lm_eval": "x"}, "no meta.lm_eval"),
        ({"lm_eval": {"filters": []}}, "list of 1..16 filter pipelines"),
        (
            {"lm_eval": {"filters": [{"name": "a", "filter": [{"function": "lowercase"}]}]}},
            "regex and take_first",
        ),
        (
            {
                "lm_eval": {
                    "filters": [{"name": "a", "filter": [{"function": "regex", "regex_pattern": "("}]}]
                }
            },
            "bad pattern",
        ),
        (
            {"lm_eval": {"filters": [{"name": "a", "filter": [{"function": "regex", "group_select": "0"}]}]}},
            "group_select must be an integer",
        ),
        ({"lm_eval": {"metric": {"metric": "f1"}}}, "exact_match's options"),
        ({"lm_eval": {"metric": {"ignore_case": "yes"}}}, "must be true or false"),
        ({"lm_eval": {"metric": {"regexes_to_ignore": ["[a"]}}}, "regexes_to_ignore: bad pattern"),
    ],
)
def test_the_item_check_names_what_cannot_be_graded(meta: dict[str, Any] | None, words: str) -> None:
    problem = item_problem("lm_eval", Item(id="7", question="q", answer="a", meta=meta))
    assert problem is not None and problem.startswith("item 7: ") and words in problem
    assert "no gold answer" in (
        item_problem("lm_eval", Item(id="7", question="q", meta={"lm_eval": {}})) or ""
    )
    # no filters: lm-eval's default pipeline (take_first), exact_match without options
    plain = Item(id="8", question="q", answer="Paris", meta={"lm_eval": {}})
    assert item_problem("lm_eval", plain) is None
    assert (
        get_grader("lm_eval")("Paris", plain).correct and not get_grader("lm_eval")(" Paris", plain).correct
    )


def test_the_detail_keeps_every_pipeline_within_its_bound() -> None:
    grades = [FilteredGrade(f"pipeline-{i}", "x" * 5000, i % 2 == 0) for i in range(16)]
    detail = encode_detail(grades, MAX_DETAIL_CHARS)
    assert len(detail) <= MAX_DETAIL_CHARS
    kept = detail_results(detail)
    assert kept is not None and [(r.name, r.correct) for r in kept] == [(g.name, g.correct) for g in grades]
    short = detail_results(encode_detail(grades[:2], MAX_DETAIL_CHARS)) or []
    assert [len(r.extracted) for r in short] == [400, 400]
    assert detail_results("expected 'Paris'") is None and detail_results(None) is None


def test_the_run_summary_reports_each_filter_as_lm_eval_does() -> None:
    def detail(strict: bool, flexible: bool) -> str:
        return encode_detail(
            [FilteredGrade("strict-match", "1", strict), FilteredGrade("flexible-extract", "1", flexible)],
            2000,
        )

    details = [
        detail(True, True),
        detail(False, True),
        detail(False, True),
        detail(False, False),
        None,
        "other",
    ]
    counts = filter_counts(details)
    assert counts == {"strict-match": (1, 4), "flexible-extract": (3, 4)}
    scores = filter_scores(counts)
    strict, flexible = scores["filters"]
    assert [strict["name"], flexible["name"]] == ["strict-match", "flexible-extract"]  # the task's order
    assert scores["scored"] == 4
    assert strict["exact_match"]["value"] == 0.25
    flexible = flexible["exact_match"]
    assert flexible["value"] == 0.75 and flexible["stderr"] == pytest.approx(
        (0.75 * 0.25 / 3) ** 0.5, abs=1e-6
    )
    assert filter_scores({}) == {"grader": "lm_eval", "scored": 0, "filters": []}


@pytest.mark.parametrize(
    "pattern",
    [
        r"#### (\-?[0-9\.\,]+)",
        r"(-?[$0-9.,]{2,})|(-?[0-9]+)",
        r"\b(Yes|No|yes|no)\b",
        r"(?s).*#### ",
        r"\.$",
        r",",
        r"\\",
        "x*",  # empty matches
        r"(a)|(b)(c)?",
        r"(?<=#)\d+",  # Python's engine only
    ],
)
def test_the_safe_compiler_finds_and_substitutes_as_python_does(pattern: str) -> None:
    rng = random.Random(pattern)
    alphabet = [
        "#",
        "#### ",
        "1",
        "2",
        "-",
        ".",
        ",",
        "$",
        " ",
        "\n",
        "a",
        "b",
        "c",
        "x",
        "Yes",
        "no",
        "é",
        "٣",
        "\\",
    ]
    compiled = compile_pattern(pattern)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        assert compiled.findall(text) == re.findall(pattern, text), (pattern, text)
        assert compiled.sub("", text) == re.sub(pattern, "", text), (pattern, text)
    with pytest.raises(ValueError, match="literal"):
        compiled.sub(r"\1", "a")


@pytest.fixture(scope="module")
def pool() -> Iterator[GradingPool]:
    p = GradingPool(processes=2, timeout_s=5.0, memory_bytes=1024 * 1024 * 1024)
    p.start()
    yield p
    p.close()


def test_a_tasks_hostile_pattern_fails_its_item_within_the_deadline(
    pool: GradingPool, tasks: dict[str, RenderedTask]
) -> None:
    bomb_meta = {
        "lm_eval": {
            "filters": [{"name": "x", "filter": [{"function": "regex", "regex_pattern": r"(a|aa)+\1$"}]}]
        }
    }
    bomb = Item(id="bomb", question="q", answer="a", meta=bomb_meta)
    good = tasks["gsm8k"].items[0]
    graded = [GradeTask("lm_eval", f"#### {i}", good) for i in range(12)]
    graded.insert(5, GradeTask("lm_eval", "a" * 60 + "!", bomb))
    graded += [GradeTask("lm_eval", text, good) for text in DEGENERATE.values()]  # linear on these
    # exponential in Python's engine, linear on RE2: graded, not timed out (the worker's compiler)
    nested = {
        "lm_eval": {"filters": [{"name": "x", "filter": [{"function": "regex", "regex_pattern": r"(a+)+$"}]}]}
    }
    graded.append(
        GradeTask("lm_eval", "a" * 40 + "!", Item(id="nested", question="q", answer="a", meta=nested))
    )
    replies = pool.grade(graded)
    last = replies.pop()
    assert last.grade is not None and (last.grade.extracted, last.grade.correct) == ("[invalid]", False)
    assert replies[5].grade is None and (replies[5].error or "").startswith("GradingTimeout: grader lm_eval")
    others = replies[:5] + replies[6:]
    assert all(r.grade is not None for r in others), [r.error for r in others if r.grade is None]
    assert [r.grade.extracted for r in others[:12] if r.grade] == [str(i) for i in range(12)]
    assert [r.grade.correct for r in others[:12] if r.grade] == [i == 18 for i in range(12)]
