"""Degenerate model outputs: each made a built-in grader step super-linear (minutes to hours)
before the rewrite of issue 12. One list, for the unit test that bounds every grader step
(tests/unit/test_bounded_grading.py), the end-to-end test through the pipeline and the
benchmark that times each step (bench/grading_degenerate.py)."""

from __future__ import annotations

DEGENERATE: dict[str, str] = {
    "answer_3000_spaces": "The answer" + " " * 3000 + "!",  # issue 12: 54 s per item in `choice`
    "spaces_100k": " " * 100_000,
    "a_50000_bang": "a" * 50_000 + "!",
    "nested_brackets": "[" * 50_000,
    "nested_braces": "{" * 50_000,
    "nested_parens": "(" * 50_000,
    "boxed_nest": "\\boxed{" * 20_000,
    "digits_100k": "1" * 100_000,
    "digits_then_spaces": "1" * 30_000 + " " * 30_000 + "x",
    "frac_digits_then_spaces": "\\frac{" + "1" * 30_000 + " " * 30_000,
    "thousands_separators": "1," * 50_000,
    "fractions": "1/" * 50_000,
    "decimals": "1." * 50_000,
    "answer_is_x10k": "answer is " * 10_000,
    "option_x10k": "option " * 10_000,
    "think_open_x15k": "<think>" * 15_000,
    "fences_x30k": "```" * 30_000,
    "fence_then_a_50000": "```" + "a" * 50_000,
    "verdict_x10k": "verdict " * 10_000,
    "json_keys": '{"a":' * 20_000,
    "quotes": '"' * 100_000,
    "newlines": "\n" * 100_000,
    "def_x20k": "def " * 20_000,
}
