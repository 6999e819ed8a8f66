from evalstream.worker.grading.clean import clean_response, defines, extract_code, strip_think


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
