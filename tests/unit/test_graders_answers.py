"""The graders that compare a response with a gold answer: exact, numeric, multiple choice
(with and without listed choices), regex, contains, JSON fields and the LLM judge. The code
grader and the registry: tests/unit/test_graders_code.py."""

from pathlib import Path
from typing import Any

import pytest

from evalstream.common.messages import Item
from evalstream.worker.engines.base import PermanentEngineError, TransientEngineError
from evalstream.worker.grading import GradingError, get_grader
from evalstream.worker.grading.contains import contains
from evalstream.worker.grading.exact import exact
from evalstream.worker.grading.json_field import json_field
from evalstream.worker.grading.judge import judge, parse_verdict
from evalstream.worker.grading.multiple_choice import multiple_choice
from evalstream.worker.grading.numeric import numeric
from evalstream.worker.grading.regex import regex
from tests.fakes.openai_provider import FakeProvider, Reply


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
            ("The answer is 2. Check: 40 + 2", "2", "2"),  # "answer is" is no marker: last number
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
        assert self.grade("#### 5\nno wait\n#### 7 (3 steps)", item).correct  # the last ####
        assert self.grade("\\boxed{7} and #### 9, 10", item).correct  # boxed beats ####
        assert self.grade("\\boxed{6} then \\boxed{x = 7}", item).correct  # the last boxed
        assert not self.grade("7 is tempting, but the answer is 8 (after 3 steps)", item).correct

    def test_policy_is_exactly_boxed_then_hashes_then_last_number(self) -> None:
        item = Item(id="q", answer="8")
        # "the answer is" is not a marker: the last number wins (policy of the issue, verbatim)
        assert self.grade("the answer is 8 (after 3 steps)", item).extracted == "3"
        # a marker decides even without a number: no falling back to the text around it
        assert self.grade("8 apples, so \\boxed{\\text{eight}}", item).extracted is None
        assert self.grade("8 apples\n#### eight", item).extracted is None

    @pytest.mark.parametrize(
        ("response", "gold", "extracted"),
        [
            ("−3 degrees", "-3", "-3"),  # Unicode minus
            ("x = \\boxed{−\\frac{3}{4}}", "-0.75", "-0.75"),
            ("答えは１２３です", "123", "123"),  # full-width digits
            ("合計 １，２３４．５", "1234.5", "1234.5"),
            ("about 1e6 stars", "1000000", "1000000"),
            ("2.5E-3 mol", "0.0025", "0.0025"),
            ("a rise of 25%", "25%", "25"),  # a gold percentage matches the bare number
            ("it is 25", "25%", "25"),
            ("3/4 of them", "0.75", "0.75"),
            ("1,000 people", "1000", "1000"),
            ("+5", "5", "5"),
        ],
    )
    def test_number_forms(self, response: str, gold: str, extracted: str) -> None:
        grade = self.grade(response, Item(id="q", answer=gold))
        assert (grade.extracted, grade.correct) == (extracted, True)

    def test_number_words_are_not_parsed(self) -> None:
        assert self.grade("forty-two", Item(id="q", answer="42")).extracted is None

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


class TestChoiceWithoutListedChoices:
    grade = staticmethod(multiple_choice())

    def test_letters_a_to_e(self) -> None:
        item = Item(id="q", question="Which? (A) x (B) y (C) z (D) w (E) v", answer="D")
        assert self.grade("The answer is D.", item).correct
        assert self.grade("(e)", item).extracted == "E"
        assert self.grade("F", item).extracted is None  # not one of A-E

    def test_gold_must_be_a_letter(self) -> None:
        with pytest.raises(GradingError, match="letters ABCDE"):
            self.grade("A", Item(id="q", answer="F"))


class TestRegex:
    def test_gold_answer_as_the_pattern(self) -> None:
        grade = regex()
        item = Item(id="q", answer=r"(?i)\b(george )?washington\b")
        assert grade("It was George Washington.", item).correct
        assert grade("washington", item).extracted == "washington"
        assert not grade("Lincoln", item).correct

    def test_pattern_without_group_must_be_found(self) -> None:
        grade = regex(r"^\d{3}-\d{4}$")
        assert grade("555-1234", Item(id="q")).correct
        assert not grade("call 555-1234", Item(id="q")).correct  # anchored to the whole response

    def test_group_extracts_and_compares_with_gold(self) -> None:
        grade = regex(r"Answer:\s*(\w+)")
        item = Item(id="q", answer="Paris")
        result = grade("Answer: Lyon... no. Answer: paris", item)  # the last match, normalised
        assert (result.extracted, result.correct) == ("paris", True)
        wrong = grade("Answer: Lyon", item)
        assert (wrong.extracted, wrong.correct, wrong.detail) == ("Lyon", False, "expected 'Paris'")

    def test_item_meta_beats_the_job_pattern(self) -> None:
        grade = regex(r"never")
        assert grade("42 apples", Item(id="q", meta={"regex": r"\b42\b"})).correct

    def test_bad_pattern_is_a_data_error(self) -> None:
        with pytest.raises(GradingError, match="bad pattern"):
            regex()("x", Item(id="q", meta={"regex": "("}))


class TestContains:
    grade = staticmethod(contains())

    def test_whole_phrase_anywhere(self) -> None:
        item = Item(id="q", answer="George Washington")
        assert self.grade("I believe it was george\n  washington, the general.", item).correct
        assert not self.grade("Washington, George", item).correct

    def test_not_inside_longer_words_or_numbers(self) -> None:
        assert not self.grade("Parisian", Item(id="q", answer="Paris")).correct
        assert not self.grade("420 or 42.5", Item(id="q", answer="42")).correct
        assert self.grade("<think>maybe 41</think>It is 42.", Item(id="q", answer="42")).correct


class TestJson:
    def test_field_of_json_in_text(self) -> None:
        grade = json_field("answer.value")
        item = Item(id="q", answer="42")
        result = grade('Sure! {"answer": {"value": 42, "unit": "m"}} Anything else?', item)
        assert (result.extracted, result.correct) == ("42", True)
        assert not grade('{"answer": {"value": 41}}', item).correct
        assert grade('{"answer": {}}', item).detail == "no field 'answer.value' in the JSON"
        assert grade("no json here", item).detail == "no JSON in the response"

    def test_fenced_block_list_index_and_meta_field(self) -> None:
        grade = json_field()
        response = 'Draft: {"items": []}\n```json\n{"items": [{"name": "Ada"}]}\n```'
        assert grade(response, Item(id="q", answer="ada", meta={"json_field": "items.0.name"})).correct

    @pytest.mark.parametrize(
        ("value", "gold", "correct"),
        [
            ('"25%"', "25", True),
            ("1000.0", "1e3", True),
            ("true", "true", True),
            ("1", "true", False),
            ('{"b": [1, 2], "a": null}', '{"a": null, "b": [1, 2]}', True),
            ('"New  York"', "new york", True),
        ],
    )
    def test_comparisons(self, value: str, gold: str, correct: bool) -> None:
        grade = json_field("v")
        assert grade(f'{{"v": {value}}}', Item(id="q", answer=gold)).correct is correct

    def test_whole_document_without_a_field(self) -> None:
        assert json_field()("[1, 2, 3]", Item(id="q", answer="[1,2,3]")).correct


class TestJudge:
    def test_parse_verdict(self) -> None:
        assert parse_verdict("The response matches.\nVERDICT: CORRECT") is True
        assert parse_verdict("verdict: correct? No.\n**Verdict:** **INCORRECT**") is False
        assert parse_verdict("<think>VERDICT: CORRECT</think>Incorrect.") is False
        assert parse_verdict("I cannot tell.") is None

    def test_replay_judge_grades_by_item(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("REPLAY_ROOT", str(tmp_path))  # the only folder replay files are read from
        verdicts = tmp_path / "verdicts.jsonl"
        verdicts.write_text(
            '{"id": "a", "response": "Same as the reference.\\nVERDICT: CORRECT"}\n'
            '{"id": "b", "response": "VERDICT: INCORRECT"}\n'
            '{"id": "c", "response": "hmm"}\n'
        )
        grade = get_grader(f"judge:replay:{verdicts}")
        a = grade("Paris", Item(id="a", question="Capital of France?", answer="Paris"))
        assert (a.extracted, a.correct, a.detail) == (
            "CORRECT",
            True,
            "Same as the reference. VERDICT: CORRECT",
        )
        assert not grade("Lyon", Item(id="b", answer="Paris")).correct
        c = grade("?", Item(id="c"))
        assert (c.correct, c.detail) == (False, "no verdict from the judge: hmm")
        with pytest.raises(PermanentEngineError):  # no verdict for this item: an engine failure
            grade("?", Item(id="zzz"))

    def test_openai_judge_sees_question_reference_response_and_rubric(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("WORKER_MODEL", "openai:*")  # the operator allows API judges

        def verdict(messages: list[dict[str, Any]]) -> str:
            prompt = messages[-1]["content"]
            return "VERDICT: CORRECT" if "Response to grade:\n1889" in prompt else "VERDICT: INCORRECT"

        with FakeProvider(answer=verdict) as provider:
            grade = judge(provider.spec("judge-model"))
            item = Item(id="q", question="When was the Eiffel Tower built?", answer="1887-1889",
                        meta={"rubric": "The completion year is enough."})  # fmt: skip
            assert grade("<think>hmm</think>1889", item).correct
            assert not grade("1900", item).correct
            sent = provider.requests[0].body or {}
        prompt = sent["messages"][-1]["content"]
        assert sent["messages"][0]["role"] == "system" and sent["temperature"] == 0.0
        for part in ("When was the Eiffel Tower built?", "Reference answer:\n1887-1889",
                     "Rubric:\nThe completion year is enough.", "VERDICT: CORRECT or VERDICT: INCORRECT"):  # fmt: skip
            assert part in prompt

    def test_judge_engine_failure_is_raised_for_a_retry(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("WORKER_MODEL", "openai:*")
        with FakeProvider() as provider:
            provider.script = lambda n, body: Reply(status=503)
            grade = judge(provider.spec("judge-model", retries=0))
            with pytest.raises(TransientEngineError):
                grade("x", Item(id="q", answer="y"))


@pytest.mark.parametrize(
    "text",
    ["0", "007", "42", "1234567", "9" * 40, "1" * 400, "١٢", "１２", "42.", "1,234", "#### 7", " 8 ", ""],
)
def test_number_fast_paths_read_what_the_regular_expression_reads(text: str) -> None:
    """parse_number and ascii_numbers skip their regular expressions for plain ASCII text:
    the value must be the one NUMBER's own reading gives (a digit string of any length, a
    non-ASCII digit, and text that needs the slow path)."""
    from evalstream.common import gold

    slow = gold._LATEX_FRAC.sub(r"\1/\2", text.translate(gold._TO_ASCII))
    slow = slow.replace("{,}", ",").replace("\\$", "$").replace("\\!", "")
    assert gold.ascii_numbers(text) == slow
    tail = slow.rsplit("####", 1)[-1].strip().rstrip(".").rstrip("%").strip()
    m = gold.NUMBER.fullmatch(tail)
    assert gold.parse_number(text) == (gold.number_value(m) if m else None)
