"""Dataset validation: every kind of bad input is refused with problems that point at the
right line and field, and what is only a warning. Good input: tests/unit/test_datasets_reading.py."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from evalstream.common.datasets import DatasetError, load_dataset
from tests.unit.dataset_inputs import HUMANEVAL, RECORDS, jsonl, one_problem, parquet, problems_of

# --------------------------------------------------------------------------- bad input

GOOD: dict[str, Any] = {"id": "ok", "question": "q", "answer": "a"}

BAD_JSONL_CASES: list[tuple[str, list[Any], str | None, str]] = [
    # (case, lines (dicts are encoded, str/bytes written raw), field, message fragment); line 2 is bad
    ("missing id", [GOOD, {"question": "q", "answer": "a"}], "id", 'missing field "id"'),
    ("empty id", [GOOD, {"id": "  ", "question": "q", "answer": "a"}], "id", 'empty "id"'),
    ("id wrong type", [GOOD, {"id": 1.5, "question": "q", "answer": "a"}], "id", "string or integer"),
    ("missing input", [GOOD, {"id": "x", "answer": "a"}], "question", 'missing field "question"'),
    ("two inputs", [GOOD, {"id": "x", "question": "q", "prompt": "p", "answer": "a"}], "prompt", "one way"),
    ("empty question", [GOOD, {"id": "x", "question": "", "answer": "a"}], "question", 'empty "question"'),
    ("question not text", [GOOD, {"id": "x", "question": 5, "answer": "a"}], "question", "must be a string"),
    ("missing answer", [GOOD, {"id": "x", "question": "q"}], "answer", 'missing field "answer"'),
    ("null answer", [GOOD, {"id": "x", "question": "q", "answer": None}], "answer", 'missing field "answer"'),
    ("boolean answer", [GOOD, {"id": "x", "question": "q", "answer": True}], "answer", "got boolean"),
    ("list answer", [GOOD, {"id": "x", "question": "q", "answer": ["a"]}], "answer", "got array"),
    (
        "choices not strings",
        [GOOD, {"id": "x", "question": "q", "answer": "a", "choices": ["a", 2]}],
        "choices",
        "list of strings",
    ),
    (
        "choices a string",
        [GOOD, {"id": "x", "question": "q", "answer": "a", "choices": "a,b"}],
        "choices",
        "list of strings, got string",
    ),
    (
        "category not text",
        [GOOD, {"id": "x", "question": "q", "answer": "a", "category": 3}],
        "category",
        "string",
    ),
    ("meta not object", [GOOD, {"id": "x", "question": "q", "answer": "a", "meta": [1]}], "meta", "object"),
    (
        "message bad role",
        [GOOD, {"id": "x", "messages": [{"role": "robot", "content": "hi"}], "answer": "a"}],
        "messages",
        "role",
    ),
    ("messages empty", [GOOD, {"id": "x", "messages": [], "answer": "a"}], "messages", "non-empty"),
    (
        "messages without user",
        [GOOD, {"id": "x", "messages": [{"role": "system", "content": "s"}], "answer": "a"}],
        "messages",
        "no user message",
    ),
    ("invalid JSON", [GOOD, '{"id": "x", "question": '], None, "not valid JSON"),
    ("not an object", [GOOD, "[1, 2]"], None, "expected a JSON object, got array"),
    ("string line", [GOOD, '"hello"'], None, "expected a JSON object, got string"),
    ("not UTF-8", [GOOD, b'{"id": "x", "question": "caf\xe9", "answer": "a"}'], None, "not valid UTF-8"),
    ("duplicate id", [GOOD, GOOD], "id", 'duplicate id "ok" (first on line 1)'),
]


def _encode_lines(lines: list[Any]) -> bytes:
    out = b""
    for line in lines:
        if isinstance(line, dict):
            out += json.dumps(line).encode()
        elif isinstance(line, str):
            out += line.encode()
        else:
            out += line
        out += b"\n"
    return out


@pytest.mark.parametrize(
    ("case", "lines", "field", "fragment"), BAD_JSONL_CASES, ids=[c[0] for c in BAD_JSONL_CASES]
)
def test_bad_jsonl_line_is_reported_with_line_and_field(
    case: str, lines: list[Any], field: str | None, fragment: str
) -> None:
    problem = one_problem(_encode_lines(lines), "bad.jsonl")
    assert problem.line == 2
    assert problem.field == field
    assert fragment in problem.message
    assert str(problem).startswith("line 2: ")


def test_invalid_json_message_carries_the_parser_error() -> None:
    problem = one_problem(b'{"id": "x", "answer": 1,}\n', "x.jsonl")
    assert problem.line == 1
    assert "trailing comma" in problem.message or "malformed" in problem.message


def test_non_utf8_names_the_byte() -> None:
    problem = one_problem(b'{"id": "x", "question": "\xff", "answer": "a"}\n', "x.jsonl")
    assert "0xff" in problem.message


def test_every_problem_is_collected_not_just_the_first() -> None:
    data = _encode_lines(
        [
            GOOD,
            {"id": "a", "question": "q"},  # 2: no answer
            "not json",  # 3
            {"question": "q", "answer": "a", "choices": "x"},  # 4: no id, bad choices
            {"id": "ok", "question": "q2", "answer": "b"},  # 5: duplicate of line 1
        ]
    )
    problems = problems_of(data, "many.jsonl")
    assert [(p.line, p.field) for p in problems] == [
        (2, "answer"),
        (3, None),
        (4, "id"),
        (4, "choices"),
        (5, "id"),
    ]


def test_duplicate_id_is_reported_even_on_an_otherwise_bad_line() -> None:
    problems = problems_of(jsonl(GOOD, {"id": "ok", "question": "q2"}), "d.jsonl")
    assert [(p.line, p.field) for p in problems] == [(2, "id"), (2, "answer")]


def test_duplicate_ids_name_both_lines_even_across_int_and_str() -> None:
    data = jsonl(
        {"id": 7, "question": "a", "answer": "1"},
        {"id": "x", "question": "b", "answer": "2"},
        {"id": "7", "question": "c", "answer": "3"},
    )
    problem = one_problem(data, "d.jsonl")
    assert (problem.line, problem.field) == (3, "id")
    assert "line 1" in problem.message and '"7"' in problem.message


@pytest.mark.parametrize(
    ("data", "filename"),
    [(b"", "e.jsonl"), (b"\n  \n\n", "e.jsonl"), (b"", "e.csv"), (b"id,question,answer\n", "e.csv")],
    ids=["empty-jsonl", "blank-jsonl", "empty-csv", "header-only-csv"],
)
def test_empty_dataset_is_refused(data: bytes, filename: str) -> None:
    problem = one_problem(data, filename)
    assert problem.line is None
    assert problem.message == "dataset is empty"


def test_empty_parquet_is_refused() -> None:
    schema = pa.schema([("id", pa.string()), ("question", pa.string()), ("answer", pa.string())])
    problem = one_problem(parquet([], schema), "e.parquet")
    assert problem.message == "dataset is empty"


def test_unknown_extension_is_refused() -> None:
    problem = one_problem(jsonl(*RECORDS), "set.txt")
    assert problem.line is None
    assert ".txt" in problem.message and ".jsonl" in problem.message


def test_json_array_gets_a_helpful_message() -> None:
    problem = one_problem(json.dumps(RECORDS).encode(), "set.json")
    assert "one JSON object per line" in problem.message


def test_csv_with_wrong_columns_says_what_is_missing_and_what_exists() -> None:
    problem = one_problem(b"id,text,gold\n1,q,a\n", "w.csv")
    assert problem.line == 1
    assert problem.field == "question"
    assert "question" in problem.message and "answer" in problem.message
    assert "id, text, gold" in problem.message
    assert "missing columns" in problem.message


def test_csv_line_numbers_count_the_header_and_multiline_cells() -> None:
    data = b'id,question,answer\nq1,"two\nlines",a\nq2,q,\nq3,q3,c\n'
    problem = one_problem(data, "m.csv")
    # header = line 1, q1 spans lines 2-3, q2 starts on line 4
    assert (problem.line, problem.field) == (4, "answer")


def test_csv_row_with_wrong_number_of_fields() -> None:
    problem = one_problem(b"id,question,answer\nq1,q,a\nq2,q,a,extra\n", "f.csv")
    assert problem.line == 3
    assert "4 fields" in problem.message


def test_csv_json_cells_are_checked() -> None:
    data = b'id,question,answer,choices\nq1,q,a,"[""a"", ""b""]"\nq2,q,a,not json\nq3,q,a,"[1]"\n'
    problems = problems_of(data, "j.csv")
    assert [(p.line, p.field) for p in problems] == [(3, "choices"), (4, "choices")]
    assert "JSON" in problems[0].message


def test_csv_non_utf8_names_the_line() -> None:
    problem = one_problem(b"id,question,answer\nq1,caf\xe9,a\n", "u.csv")
    assert problem.line == 2
    assert "UTF-8" in problem.message


def test_corrupt_parquet_is_one_problem_with_the_pyarrow_error() -> None:
    data = parquet(RECORDS)
    problem = one_problem(data[: len(data) // 2], "c.parquet")
    assert problem.line is None
    assert problem.message.startswith("not a readable Parquet file: ")
    assert len(problem.message) > len("not a readable Parquet file: ")
    # a JSONL file renamed to .parquet is refused the same way
    assert one_problem(jsonl(*RECORDS), "renamed.parquet").message.startswith("not a readable Parquet")


def test_parquet_problems_name_the_row() -> None:
    rows: list[dict[str, Any]] = [
        dict(GOOD),
        {"id": "b", "question": "q", "answer": None},
        {"id": "c", "question": None, "answer": "x"},
    ]
    problems = problems_of(parquet(rows), "r.parquet")
    assert [(p.line, p.field) for p in problems] == [(2, "answer"), (3, "question")]
    assert str(problems[0]).startswith("row 2: ")


def test_parquet_with_wrong_columns() -> None:
    problem = one_problem(parquet([{"id": "a", "text": "q", "answer": "a"}]), "w.parquet")
    assert problem.field == "question"
    assert "id, text, answer" in problem.message


def test_item_too_large_for_a_kafka_message() -> None:
    data = jsonl(GOOD, {"id": "big", "question": "x" * 2000, "answer": "a"})
    problem = one_problem(data, "big.jsonl", max_item_bytes=1000)
    assert problem.line == 2
    assert "big" in problem.message and "1000" in problem.message
    # the default limit lets it through
    assert len(load_dataset(data, "big.jsonl").items) == 2


def test_humaneval_problems() -> None:
    bad = [
        HUMANEVAL[0],
        {**HUMANEVAL[1], "test": None},  # 2: missing test
        {**HUMANEVAL[1], "task_id": "HumanEval/2", "entry_point": "not a name"},  # 3
        {**HUMANEVAL[1], "task_id": "HumanEval/3", "test": "assert True"},  # 4: no check()
    ]
    problems = problems_of(jsonl(*bad), "he.jsonl")
    assert [(p.line, p.field) for p in problems] == [(2, "test"), (3, "entry_point"), (4, "test")]


def test_error_message_lists_the_first_twenty_and_counts_the_rest() -> None:
    data = jsonl(*({"id": f"x{i}", "question": "q"} for i in range(25)))
    with pytest.raises(DatasetError) as info:
        load_dataset(data, "many.jsonl")
    assert len(info.value.problems) == 25
    text = str(info.value)
    assert "25 problems in many.jsonl" in text
    assert 'line 7: missing field "answer"' in text
    assert "line 20:" in text and "line 21:" not in text
    assert "and 5 more" in text


# --------------------------------------------------------------------------- warnings


def test_same_question_with_different_answers_is_a_warning() -> None:
    data = jsonl(
        {"id": "a", "question": "What is the capital of France?", "answer": "Paris"},
        {"id": "b", "question": "2+2?", "answer": "4"},
        {"id": "c", "question": "  what is the   capital of FRANCE ", "answer": "Lyon"},
    )
    ds = load_dataset(data, "w.jsonl")
    assert len(ds.items) == 3
    assert len(ds.warnings) == 1
    warning = ds.warnings[0]
    assert warning.line == 3
    assert '"a"' in warning.message and '"c"' in warning.message
    assert "Lyon" in warning.message and "Paris" in warning.message


def test_same_question_with_the_same_answer_is_not_a_warning() -> None:
    data = jsonl(
        {"id": "a", "question": "Capital of France?", "answer": "Paris"},
        {"id": "b", "question": "capital of france", "answer": "paris."},
        # same text but different choices: a different question
        {"id": "c", "question": "Capital of France?", "answer": "B", "choices": ["Rome", "Paris"]},
    )
    assert load_dataset(data, "w.jsonl").warnings == []


def test_unknown_fields_are_a_warning_not_an_error() -> None:
    data = jsonl({**GOOD, "difficulty": 1}, {"id": "b", "question": "q2", "answer": "a", "difficulty": 2})
    ds = load_dataset(data, "u.jsonl")
    assert len(ds.items) == 2
    assert [(w.line, w.field) for w in ds.warnings] == [(1, "difficulty")]
    assert "2 lines" in ds.warnings[0].message
