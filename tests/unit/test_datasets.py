"""Dataset readers and validation: every format gives the same items, and every kind of bad
input is refused with problems that point at the right line and field."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalstream.common.datasets import (
    DatasetError,
    LoadedDataset,
    Problem,
    content_sha256,
    load_dataset,
    load_dataset_file,
)
from evalstream.common.messages import ChatMessage, Item
from tests.support import sample_path

RECORDS: list[dict[str, Any]] = [
    {"id": "q1", "question": "What is 2 + 3?", "answer": "5", "category": "arithmetic"},
    {"id": "q2", "question": "Capital of France?", "answer": "Paris", "choices": ["Paris", "Rome"]},
    {"id": "q3", "question": "Colour of the sky?", "answer": "blue", "meta": {"source": "demo", "level": 1}},
]
EXPECTED = [
    Item(id="q1", question="What is 2 + 3?", answer="5", category="arithmetic"),
    Item(id="q2", question="Capital of France?", answer="Paris", choices=["Paris", "Rome"]),
    Item(id="q3", question="Colour of the sky?", answer="blue", meta={"source": "demo", "level": 1}),
]

HUMANEVAL: list[dict[str, Any]] = [
    {
        "task_id": "HumanEval/0",
        "prompt": "def add(a, b):\n    '''Add.'''\n",
        "canonical_solution": "    return a + b\n",
        "entry_point": "add",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
    },
    {
        "task_id": "HumanEval/1",
        "prompt": "def neg(x):\n    '''Negate.'''\n",
        "entry_point": "neg",
        "test": "def check(candidate):\n    assert candidate(1) == -1\n",
        "category": "easy_code",
    },
]


def jsonl(*records: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def csv_bytes(text: str) -> bytes:
    return text.encode()


def parquet(records: list[dict[str, Any]], schema: pa.Schema | None = None) -> bytes:
    """(pa.Table.from_pylist takes its columns from the first row only, hence from_pydict.)"""
    names = list(dict.fromkeys(k for r in records for k in r)) if schema is None else schema.names
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pydict({n: [r.get(n) for r in records] for n in names}, schema=schema), buf)
    return buf.getvalue()


GOOD_CSV = (
    "id,question,answer,choices,category,meta\n"
    'q1,"What is 2 + 3?",5,,arithmetic,\n'
    'q2,Capital of France?,Paris,"[""Paris"", ""Rome""]",,\n'
    'q3,Colour of the sky?,blue,,,"{""source"": ""demo"", ""level"": 1}"\n'
)


def problems_of(data: bytes, filename: str, **kw: Any) -> list[Problem]:
    with pytest.raises(DatasetError) as info:
        load_dataset(data, filename, **kw)
    assert info.value.problems, "a DatasetError must carry at least one problem"
    return info.value.problems


def one_problem(data: bytes, filename: str, **kw: Any) -> Problem:
    problems = problems_of(data, filename, **kw)
    assert len(problems) == 1, problems
    return problems[0]


# --------------------------------------------------------------------------- good input


def test_jsonl_csv_parquet_give_the_same_items() -> None:
    loaded = {
        "jsonl": load_dataset(jsonl(*RECORDS), "set.jsonl"),
        "csv": load_dataset(csv_bytes(GOOD_CSV), "set.csv"),
        "parquet": load_dataset(parquet(RECORDS), "set.parquet"),
    }
    for fmt, ds in loaded.items():
        assert ds.format == fmt
        assert ds.items == EXPECTED, fmt
        assert ds.warnings == []
    assert len({ds.content_sha256 for ds in loaded.values()}) == 1
    assert len({ds.sha256 for ds in loaded.values()}) == 3  # raw bytes differ


def test_sha256_is_of_the_raw_bytes() -> None:
    import hashlib

    data = jsonl(*RECORDS)
    assert load_dataset(data, "x.jsonl").sha256 == hashlib.sha256(data).hexdigest()


def test_numbers_become_canonical_strings() -> None:
    ds = load_dataset(
        jsonl(
            {"id": 7, "question": "a", "answer": 42},
            {"id": "b", "question": "b", "answer": 2.5},
            {"id": "c", "question": "c", "answer": 1e-7},
            {"id": "d", "question": "d", "answer": -3},
        ),
        "n.jsonl",
    )
    assert [(i.id, i.answer) for i in ds.items] == [("7", "42"), ("b", "2.5"), ("c", "1e-07"), ("d", "-3")]


def test_parquet_numeric_columns_become_strings() -> None:
    schema = pa.schema([("id", pa.int64()), ("question", pa.string()), ("answer", pa.float64())])
    data = parquet(
        [{"id": 1, "question": "a", "answer": 42.0}, {"id": 2, "question": "b", "answer": 2.5}], schema
    )
    ds = load_dataset(data, "n.parquet")
    assert [(i.id, i.answer) for i in ds.items] == [("1", "42"), ("2", "2.5")]


def test_prompt_and_messages_are_inputs() -> None:
    ds = load_dataset(
        jsonl(
            {"id": "p", "prompt": "Say hi", "answer": "hi"},
            {
                "id": "m",
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
                "answer": "4",
            },
        ),
        "m.jsonl",
    )
    assert ds.items[0] == Item(id="p", question="Say hi", answer="hi")
    assert ds.items[1].messages == [ChatMessage("system", "Be brief."), ChatMessage("user", "2+2?")]
    assert ds.items[1].question is None


def test_humaneval_is_recognised_by_its_fields() -> None:
    ds = load_dataset(jsonl(*HUMANEVAL), "HumanEval.jsonl")
    assert ds.format == "humaneval"
    first, second = ds.items
    assert first == Item(
        id="HumanEval/0",
        question=HUMANEVAL[0]["prompt"],
        category="code",
        entry_point="add",
        test=HUMANEVAL[0]["test"],
        meta={"canonical_solution": "    return a + b\n"},
    )
    assert first.answer is None
    assert second.category == "easy_code"
    # the same tasks as Parquet (as published on the Hugging Face hub) are the same items
    pq_ds = load_dataset(parquet(HUMANEVAL), "humaneval.parquet")
    assert pq_ds.format == "humaneval"
    assert pq_ds.items == ds.items
    assert pq_ds.content_sha256 == ds.content_sha256


def test_blank_lines_are_skipped_and_lines_still_counted() -> None:
    data = b"\n" + jsonl(RECORDS[0]) + b"   \n\r\n" + jsonl({"id": "x", "question": "q"}) + b"\n"
    problem = one_problem(data, "b.jsonl")
    # lines: 1 blank, 2 record, 3 spaces, 4 "\r", 5 the bad record
    assert (problem.line, problem.field) == (5, "answer")


def test_crlf_and_byte_order_mark_are_accepted() -> None:
    data = b"\xef\xbb\xbf" + jsonl(*RECORDS).replace(b"\n", b"\r\n")
    assert load_dataset(data, "w.jsonl").items == EXPECTED
    csv_data = b"\xef\xbb\xbf" + GOOD_CSV.replace("\n", "\r\n").encode()
    assert load_dataset(csv_data, "w.csv").items == EXPECTED


def test_load_dataset_file_reads_from_disk(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_bytes(jsonl(*RECORDS))
    ds = load_dataset_file(path)
    assert isinstance(ds, LoadedDataset)
    assert ds.items == EXPECTED
    assert ds.filename == "set.jsonl"
    assert len(ds) == 3


# --------------------------------------------------------------------------- content hash


def test_content_hash_ignores_order() -> None:
    forward = load_dataset(jsonl(*RECORDS), "a.jsonl")
    backward = load_dataset(jsonl(*reversed(RECORDS)), "b.jsonl")
    assert forward.items != backward.items
    assert forward.content_sha256 == backward.content_sha256
    assert forward.sha256 != backward.sha256


def test_content_hash_changes_with_a_gold_label() -> None:
    changed = [dict(r) for r in RECORDS]
    changed[1]["answer"] = "Rome"
    assert (
        load_dataset(jsonl(*RECORDS), "a.jsonl").content_sha256
        != load_dataset(jsonl(*changed), "a.jsonl").content_sha256
    )


def test_content_hash_ignores_key_order_within_items() -> None:
    a = Item(id="x", question="q", answer="a", meta={"b": 1, "a": 2})
    b = Item(id="x", question="q", answer="a", meta={"a": 2, "b": 1})
    assert content_sha256([a]) == content_sha256([b])
    assert content_sha256([a]) != content_sha256([Item(id="x", question="q", answer="a")])


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


# --------------------------------------------------------------------------- bundled samples


def test_demo_sample_loads_cleanly() -> None:
    ds = load_dataset_file(sample_path("demo.jsonl"))
    assert ds.format == "jsonl"
    assert ds.warnings == []
    assert len(ds.items) == 42
    assert Counter(i.category for i in ds.items) == {"arithmetic": 18, "word_problem": 12, "factual": 12}
    by_id = {i.id: i for i in ds.items}
    assert by_id["fact-01"].answer == "Paris"
    assert all(i.answer for i in ds.items)


def test_demo_code_sample_loads_cleanly_and_its_solutions_pass() -> None:
    ds = load_dataset_file(sample_path("demo_code.jsonl"))
    assert ds.format == "humaneval"
    assert ds.warnings == []
    assert len(ds.items) == 8
    for item in ds.items:
        assert item.category == "code" and item.entry_point and item.test and item.question
        assert item.meta is not None
        program = (
            item.question
            + item.meta["canonical_solution"]
            + "\n"
            + item.test
            + f"\ncheck({item.entry_point})\n"
        )
        exec(compile(program, item.id, "exec"), {})  # the gold solution must pass its own test
