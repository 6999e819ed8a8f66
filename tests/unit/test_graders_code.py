"""The code grader (HumanEval-style tests run in the sandbox, pass@k) and the graders'
registry: SPEC names, aliases, arguments, `auto` and versions. The answer graders:
tests/unit/test_graders_answers.py."""

import math
import re
import shutil

import pytest

from evalstream.common.graders import grader_problem
from evalstream.common.messages import Item
from evalstream.worker.grading import (
    GRADER_NAMES,
    GRADER_VERSIONS,
    GRADERS,
    GradingError,
    get_grader,
    grader_version,
    item_problem,
    resolve_grader,
)
from evalstream.worker.grading.code_exec import MAX_EXTRACTED, code_exec, pass_at_k
from evalstream.worker.sandbox import Limits, SandboxUnavailable

# `make up` installs bubblewrap; without it the sandbox, and so these tests, fail.

PROMPT = (
    "from typing import List\n\n\n"
    "def below_zero(operations: List[int]) -> bool:\n"
    '    """Whether the running balance ever drops below zero."""\n'
)
TEST = (
    "\n\ndef check(candidate):\n"
    "    assert candidate([1, 2, -3]) is False\n"
    "    assert candidate([1, 2, -4, 5]) is True\n"
)
BODY = "    balance = 0\n    for op in operations:\n        balance += op\n        if balance < 0:\n"
BODY += "            return True\n    return False\n"
CODE_ITEM = Item(id="HumanEval/3", question=PROMPT, entry_point="below_zero", test=TEST)


class TestCodeExec:
    grade = staticmethod(code_exec())

    def test_whole_function_in_a_fence_passes(self) -> None:
        # the prompt's `from typing import List` stays in scope
        response = f"Sure:\n```python\ndef below_zero(operations: List[int]) -> bool:\n{BODY}```\n"
        grade = self.grade(response, CODE_ITEM)
        assert (grade.correct, grade.score, grade.detail) == (True, 1.0, None)
        assert grade.extracted is not None and grade.extracted.startswith("from typing import List")

    def test_body_continuation_passes_even_when_stripped(self) -> None:
        assert self.grade(BODY, CODE_ITEM).correct
        assert self.grade(BODY.strip(), CODE_ITEM).correct  # the worker strips responses

    def test_wrong_solution_fails_with_the_assertion(self) -> None:
        grade = self.grade("```python\ndef below_zero(operations):\n    return False\n```", CODE_ITEM)
        assert (grade.correct, grade.score) == (False, 0.0)
        assert grade.detail is not None
        assert grade.detail.startswith("AssertionError at line ")
        assert grade.detail.endswith("assert candidate([1, 2, -4, 5]) is True")

    def test_syntax_error_and_empty_response(self) -> None:
        grade = self.grade("```python\ndef below_zero(ops:\n    pass\n```", CODE_ITEM)
        assert not grade.correct and grade.detail is not None and grade.detail.startswith("SyntaxError")
        assert self.grade("", CODE_ITEM).detail == "no code in the response"

    def test_timeout_and_extracted_truncation(self) -> None:
        slow = code_exec(Limits(timeout_s=1.0))
        pad = "#" * 5000
        grade = slow(f"```python\ndef below_zero(o):\n    while True:\n        pass\n{pad}\n```", CODE_ITEM)
        assert (grade.correct, grade.detail) == (False, "timed out after 1 s")
        assert grade.extracted is not None and len(grade.extracted) == MAX_EXTRACTED


class TestCodeExecWithoutSandbox:
    def test_never_runs_unsandboxed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(shutil, "which", lambda name: None)
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            code_exec()(BODY, CODE_ITEM)

    def test_item_without_tests_is_a_data_error(self) -> None:
        with pytest.raises(GradingError):
            code_exec()(BODY, Item(id="q", question=PROMPT, entry_point="below_zero"))


class TestRegistry:
    def test_auto_picks_by_item_shape(self) -> None:
        assert resolve_grader("auto", CODE_ITEM) == "code"
        assert resolve_grader("auto", Item(id="q", answer="2", choices=["a", "b", "c"])) == "choice"
        assert resolve_grader("auto", Item(id="q", answer="1,234.5")) == "numeric"
        assert resolve_grader("auto", Item(id="q", answer="Paris")) == "exact"
        assert resolve_grader("exact", Item(id="q", answer="12")) == "exact"

    def test_names_aliases_and_arguments(self) -> None:
        assert set(GRADERS) == {
            *("exact", "numeric", "choice", "regex", "contains", "json", "code", "judge"),
            *("loglikelihood", "perplexity", "lm_eval"),
        }
        assert set(GRADER_NAMES) == {"auto", *GRADERS, "multiple_choice", "code_exec"}
        assert resolve_grader("code_exec", CODE_ITEM) == "code"
        assert resolve_grader("multiple_choice", Item(id="q")) == "choice"
        assert resolve_grader("regex:^a:b$", Item(id="q")) == "regex:^a:b$"
        assert get_grader("multiple_choice") is get_grader("choice")  # one instance per SPEC

    @pytest.mark.parametrize(
        ("spec", "fragment"),
        [
            ("fuzzy", "unknown grader 'fuzzy'"),
            ("exact:x", "takes no argument"),
            ("regex:(", "bad pattern"),
            ("json:a..b", "bad JSON field path"),
            ("judge", "needs an argument: judge:<model SPEC>"),
            ("judge:gpt-4", "unknown model SPEC"),
        ],
    )
    def test_bad_specs_are_rejected(self, spec: str, fragment: str) -> None:
        assert fragment in (grader_problem(spec) or "")
        with pytest.raises(ValueError, match=re.escape(fragment)):
            resolve_grader(spec, Item(id="q"))
        with pytest.raises(ValueError):
            get_grader(spec)

    def test_good_specs_pass_the_producer_check(self) -> None:
        for spec in ("auto", "choice", "code_exec", "regex", "regex:^\\d+$", "json", "json:a.0.b",
                     "judge:replay:verdicts.jsonl", "judge:openai:m@http://127.0.0.1:1/v1"):  # fmt: skip
            assert grader_problem(spec) is None, spec

    def test_auto_without_item_dispatches_per_call(self) -> None:
        grader = get_grader("auto")
        assert grader("42", Item(id="a", answer="42.0")).extracted == "42"
        assert grader("B", Item(id="b", answer="B", choices=["x", "y"])).correct

    def test_item_problem_and_versions(self) -> None:
        assert item_problem("auto", Item(id="q", answer="7")) is None
        assert item_problem("numeric", Item(id="q", answer="seven")) is not None
        assert item_problem("code_exec", Item(id="q", answer="7")) is not None
        assert item_problem("regex", Item(id="q")) is not None  # no pattern anywhere
        assert item_problem("regex:x", Item(id="q")) is None
        assert grader_version("numeric") == "numeric/2 clean/1"
        assert grader_version("multiple_choice") == grader_version("choice") == "choice/1 clean/1"
        assert grader_version("regex:^a") == "regex/1 clean/1"
        assert grader_version("auto").split() == [
            "auto/1",
            "choice/1",
            "code/3",
            "exact/1",
            "numeric/2",
            "clean/1",
        ]
        assert set(GRADER_VERSIONS) == set(GRADERS)


class TestPassAtK:
    def test_known_values(self) -> None:
        assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
        assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
        assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
        assert pass_at_k(10, 6, 5) == 1.0  # fewer than k failures: every draw passes
        assert pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))

    def test_bad_arguments(self) -> None:
        for n, c, k in ((5, 6, 1), (5, 1, 0), (5, 1, 6), (5, -1, 1)):
            with pytest.raises(ValueError):
                pass_at_k(n, c, k)
