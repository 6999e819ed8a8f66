"""Dataset readers: every format (JSONL, CSV, Parquet, HumanEval) gives the same items, the
content hash, and the bundled samples. Bad input: tests/unit/test_datasets_problems.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa

from evalstream.common.datasets import LoadedDataset, content_sha256, load_dataset, load_dataset_file
from evalstream.common.messages import ChatMessage, Item
from tests.support import sample_path
from tests.unit.dataset_inputs import HUMANEVAL, RECORDS, jsonl, one_problem, parquet

EXPECTED = [
    Item(id="q1", question="What is 2 + 3?", answer="5", category="arithmetic"),
    Item(id="q2", question="Capital of France?", answer="Paris", choices=["Paris", "Rome"]),
    Item(id="q3", question="Colour of the sky?", answer="blue", meta={"source": "demo", "level": 1}),
]


def csv_bytes(text: str) -> bytes:
    return text.encode()


GOOD_CSV = (
    "id,question,answer,choices,category,meta\n"
    'q1,"What is 2 + 3?",5,,arithmetic,\n'
    'q2,Capital of France?,Paris,"[""Paris"", ""Rome""]",,\n'
    'q3,Colour of the sky?,blue,,,"{""source"": ""demo"", ""level"": 1}"\n'
)


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


def test_a_question_repeated_with_another_answer_is_warned_against_its_first_asking() -> None:
    import random

    rnd = random.Random(7)
    records, first_line, expected = [], {}, []
    for line in range(1, 2001):
        q = rnd.randrange(300)  # about 6 askings per question
        answer = str(rnd.choice([q, q, q, q + 1]))  # a quarter of repeats disagree
        records.append({"id": f"i{line}", "question": f"What is {q}?", "answer": answer})
        if q not in first_line:
            first_line[q] = (line, answer)
        elif answer != first_line[q][1]:  # compared with the first asking, not the previous
            expected.append((first_line[q][0], line))
    loaded = load_dataset(jsonl(*records), "set.jsonl")
    warned = [
        (int(w.message.split(f"{w.unit} ")[1].split(")")[0]), w.line)
        for w in loaded.warnings
        if "with a different answer" in w.message
    ]
    assert len(expected) > 50 and warned == expected


def test_a_repeated_question_with_other_choices_is_another_question() -> None:
    """The question's key holds its choices: other choices, another question (no warning);
    the same choices with another answer, a conflict (the key's digest is confirmed on the
    items' own keys)."""
    loaded = load_dataset(
        jsonl(
            {"id": "a", "question": "Pick one.", "choices": ["x", "y"], "answer": "x"},
            {"id": "b", "question": "pick one", "choices": ["y", "x"], "answer": "y"},
            {"id": "c", "question": "Pick  one!", "choices": ["x", "y"], "answer": "y"},
            {"id": "d", "question": "Pick one.", "answer": "z"},
        ),
        "set.jsonl",
    )
    conflicts = [(w.line, w.message) for w in loaded.warnings if "with a different answer" in w.message]
    assert conflicts == [
        (3, "\"c\" repeats the question of \"a\" (line 1) with a different answer: 'y' vs 'x'")
    ]
