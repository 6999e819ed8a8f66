import shutil

import pytest

from evalstream.common.messages import Item
from evalstream.worker.grading import (
    GRADER_NAMES,
    GRADERS,
    GradingError,
    get_grader,
    grader_version,
    item_problem,
    resolve_grader,
)
from evalstream.worker.grading.code_exec import MAX_EXTRACTED, code_exec
from evalstream.worker.grading.exact import exact
from evalstream.worker.grading.multiple_choice import multiple_choice
from evalstream.worker.grading.numeric import numeric
from evalstream.worker.sandbox import Limits, SandboxUnavailable

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)


class TestExact:
    grade = staticmethod(exact())

    def test_sentence_containing_a_single_word_answer(self) -> None:
        item = Item(id="q", answer="Paris")
        assert self.grade("The capital of France is Paris.", item).correct
        assert not self.grade("The capital of France is Lyon.", item).correct
        assert not self.grade("Lyon", item).correct

    def test_whole_words_only(self) -> None:
        assert not self.grade("Parisian food is great.", Item(id="q", answer="Paris")).correct
        assert not self.grade("It is 42.5 metres.", Item(id="q", answer="42")).correct

    def test_normalisation(self) -> None:
        item = Item(id="q", answer="George  Washington.")
        grade = self.grade('  The answer is: **"george washington"**!  ', item)
        assert (grade.extracted, grade.correct, grade.score) == ("george washington", True, 1.0)

    def test_last_line_is_the_answer(self) -> None:
        item = Item(id="q", answer="New York")
        assert self.grade("Let me think about the biggest US city.\nNew York", item).correct
        # no sentence leniency for multi-word answers
        assert not self.grade("It is New York City, the largest.", item).correct

    def test_empty_response_and_missing_gold(self) -> None:
        grade = self.grade("<think>hmm", Item(id="q", answer="x"))
        assert (grade.extracted, grade.correct, grade.score) == (None, False, 0.0)
        with pytest.raises(GradingError):
            self.grade("x", Item(id="q"))


class TestNumeric:
    grade = staticmethod(numeric())

    @pytest.mark.parametrize(
        ("response", "gold", "extracted"),
        [
            ("-3", "-3", "-3"),
            ("In total 1,234 apples", "1234", "1234"),
            ("It costs 3.50", "3.5", "3.5"),
            ("Half of it: 1/2", "0.5", "0.5"),
            ("She pays $12", "12", "12"),
            ("A rise of 12%", "12", "12"),
            ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18\n#### 18", "18", "18"),
            ("so \\boxed{42}, not 41", "42", "42"),
            ("The answer is 42. Check: 40 + 2", "42", "42"),
            ("x = \\boxed{\\frac{3}{4}}", "0.75", "0.75"),
            ("5 - 3 = 2", "2", "2"),
        ],
    )
    def test_extracts_the_answer_number(self, response: str, gold: str, extracted: str) -> None:
        grade = self.grade(response, Item(id="q", answer=gold))
        assert (grade.extracted, grade.correct, grade.score) == (extracted, True, 1.0)

    def test_markers_beat_the_last_number(self) -> None:
        item = Item(id="q", answer="7")
        assert self.grade("#### 7\nwhich took me 3 minutes", item).correct
        assert not self.grade("7 is tempting, but the answer is 8 (after 3 steps)", item).correct

    def test_wrong_or_missing_number(self) -> None:
        item = Item(id="q", answer="Natalia sold 48/2 = 24 clips in May.\n#### 72")  # GSM8K gold
        wrong = self.grade("She sold 71 clips.", item)
        assert (wrong.extracted, wrong.correct, wrong.detail) == ("71", False, "expected 72")
        assert self.grade("no idea", item).extracted is None

    def test_tolerance(self) -> None:
        item = Item(id="q", answer="0.3")
        assert self.grade(repr(0.1 + 0.2), item).correct
        assert self.grade("0.3000001", item).correct
        assert not self.grade("0.30001", item).correct

    def test_non_numeric_gold_is_a_data_error(self) -> None:
        with pytest.raises(GradingError):
            self.grade("42", Item(id="q", answer="forty-two"))


class TestMultipleChoice:
    grade = staticmethod(multiple_choice())
    item = Item(id="q", answer="B", choices=["Paris", "Madrid", "Lyon", "Rome"])

    @pytest.mark.parametrize(
        "response",
        ["B", "(b)", "Answer: B", "The correct answer is **B**.", "B) Madrid", "Madrid", "It is Madrid."],
    )
    def test_reads_the_choice(self, response: str) -> None:
        grade = self.grade(response, self.item)
        assert (grade.extracted, grade.correct, grade.score) == ("B", True, 1.0)

    def test_wrong_choice(self) -> None:
        grade = self.grade("The answer is C, not option B", self.item)
        assert (grade.extracted, grade.correct, grade.detail) == ("C", False, "expected B")

    @pytest.mark.parametrize(
        "response", ["E", "A good question; I am not sure.", "Either Paris or Madrid.", ""]
    )
    def test_no_choice_found(self, response: str) -> None:
        grade = self.grade(response, self.item)
        assert (grade.extracted, grade.correct) == (None, False)

    def test_gold_as_text_or_index(self) -> None:
        choices = ["Paris", "Madrid", "Lyon"]
        assert self.grade("C", Item(id="q", answer="lyon", choices=choices)).correct
        assert self.grade("C", Item(id="q", answer="2", choices=choices)).correct
        with pytest.raises(GradingError):
            self.grade("C", Item(id="q", answer="Berlin", choices=choices))


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


@needs_bwrap
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
        assert resolve_grader("auto", CODE_ITEM) == "code_exec"
        assert resolve_grader("auto", Item(id="q", answer="2", choices=["a", "b", "c"])) == "multiple_choice"
        assert resolve_grader("auto", Item(id="q", answer="1,234.5")) == "numeric"
        assert resolve_grader("auto", Item(id="q", answer="Paris")) == "exact"
        assert resolve_grader("exact", Item(id="q", answer="12")) == "exact"

    def test_unknown_grader_is_rejected(self) -> None:
        assert (
            GRADER_NAMES == {"auto", *GRADERS} == {"auto", "exact", "numeric", "multiple_choice", "code_exec"}
        )
        with pytest.raises(ValueError, match="unknown grader 'fuzzy'"):
            resolve_grader("fuzzy", Item(id="q"))
        with pytest.raises(ValueError):
            get_grader("fuzzy")

    def test_auto_without_item_dispatches_per_call(self) -> None:
        grader = get_grader("auto")
        assert grader("42", Item(id="a", answer="42.0")).extracted == "42"
        assert grader("B", Item(id="b", answer="B", choices=["x", "y"])).correct

    def test_item_problem_and_versions(self) -> None:
        assert item_problem("auto", Item(id="q", answer="7")) is None
        assert item_problem("numeric", Item(id="q", answer="seven")) is not None
        assert item_problem("code_exec", Item(id="q", answer="7")) is not None
        assert grader_version("numeric") == "numeric/1 clean/1"
        assert grader_version("auto").split() == [
            "auto/1", "code_exec/1", "exact/1", "multiple_choice/1", "numeric/1", "clean/1"
        ]  # fmt: skip
