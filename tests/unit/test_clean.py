import time

from evalstream.worker.grading.clean import clean_response, defines, extract_code, extract_json, strip_think


class TestCleanResponse:
    def test_drops_think_blocks_and_strips(self) -> None:
        assert clean_response("<think>2+2... carry the one</think>\n  4 \n") == "4"
        assert clean_response("<THINK>a</THINK>x<think>b</think>y") == "xy"

    def test_unterminated_leading_think_leaves_nothing(self) -> None:
        assert clean_response("<think>still reasoning when max_tokens hit") == ""

    def test_unterminated_think_after_an_answer_is_dropped(self) -> None:
        assert clean_response("Paris <think>or was it") == "Paris"

    def test_stray_closing_tag_ends_the_reasoning(self) -> None:
        # templates (DeepSeek-R1) open <think> in the prompt: only the closing tag comes back
        assert clean_response("let me see, 6*7...\n</think>\n\n42") == "42"

    def test_plain_text_untouched_but_stripped(self) -> None:
        assert clean_response("  The answer is 5.\n") == "The answer is 5."

    def test_strip_think_keeps_indentation(self) -> None:
        assert strip_think("<think>x</think>    return 1\n") == "    return 1\n"


class TestExtractCode:
    def test_python_fence(self) -> None:
        text = "Here it is:\n```python\ndef f(x):\n    return x\n```\nHope it helps."
        assert extract_code(text, "f") == "def f(x):\n    return x"

    def test_bare_fence(self) -> None:
        assert extract_code("```\nprint(1)\n```", None) == "print(1)"

    def test_prefers_the_block_defining_the_entry_point(self) -> None:
        text = "```python\nimport math\n```\nthen\n```python\ndef g():\n    pass\n```"
        assert extract_code(text, "g") == "def g():\n    pass"

    def test_first_python_block_when_none_defines_it(self) -> None:
        text = "```python\na = 1\n```\n```python\nb = 2\n```"
        assert extract_code(text, "missing") == "a = 1"

    def test_python_blocks_win_over_other_languages(self) -> None:
        text = "```bash\npip install x\n```\n```python\nx = 1\n```"
        assert extract_code(text, None) == "x = 1"

    def test_unclosed_fence_runs_to_the_end(self) -> None:
        assert extract_code("```python\ndef f():\n    return 2", "f") == "def f():\n    return 2"

    def test_without_fences_keeps_the_body_indentation(self) -> None:
        body = "\n    return sorted(xs)\n\n"
        assert extract_code(body, "f") == "    return sorted(xs)"


def test_defines_only_top_level_functions() -> None:
    assert defines("import os\n\nasync def run(x):\n    pass", "run")
    assert not defines("def running(x):\n    pass", "run")
    assert not defines("    def run(x):\n        pass", "run")  # nested: part of a body


class TestExtractJson:
    def test_object_in_surrounding_text(self) -> None:
        assert extract_json('Sure! Here it is: {"a": [1, {"b": null}]} Hope that helps.') == {
            "a": [1, {"b": None}]
        }

    def test_last_value_wins_and_fences_first(self) -> None:
        assert extract_json('First {"v": 1}, then corrected: {"v": 2}') == {"v": 2}
        fenced = 'Final: {"v": 3}\n```json\n{"v": 4}\n```\nand [5]'
        assert extract_json(fenced) == {"v": 4}  # a ```json block beats loose JSON

    def test_brackets_that_are_not_json_are_skipped(self) -> None:
        assert extract_json("See [1] and {this}, but [2, 3] is data") == [2, 3]
        assert extract_json('<think>{"v": 0}</think>no JSON here') is None
        assert extract_json("just 42") is None  # scalars in prose are not JSON answers

    def test_hostile_input_stays_cheap(self) -> None:
        started = time.monotonic()
        assert extract_json("[" * 50_000) is None  # nesting too deep: no crash
        # the scan gives up after a bounded number of failed starts
        assert extract_json("{" * 10_000 + '{"ok": true}') is None
        assert extract_json("{" * 100 + '{"ok": true}') == {"ok": True}
        assert time.monotonic() - started < 2.0
