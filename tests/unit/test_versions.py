"""Dataset versions: a version is the content, whatever the file's name, order or format;
a changed label is a new version, and `datasets diff` names what changed. Also: the stored
copy a reproduction reads is the same version, and grader versions have one source."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalstream.common import graders
from evalstream.common.analysis.versions import diff_items, read_items
from evalstream.common.datasets import load_dataset, write_stored_copy
from evalstream.common.messages import ChatMessage, Item
from tests.support import sample_path

RECORDS: list[dict[str, Any]] = [
    {"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i), "category": "arithmetic"}
    for i in range(20)
]


def stored_copy(items: list[Item]) -> bytes:
    out = io.BytesIO()
    write_stored_copy(items, out)
    return out.getvalue()


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(rows: list[dict[str, Any]]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def version(data: bytes, filename: str) -> str:
    return read_items(data, filename)[0]


def test_same_content_is_one_version_whatever_the_name_order_or_format() -> None:
    shuffled = RECORDS[:]
    random.Random(5).shuffle(shuffled)
    csv_text = "id,question,answer,category\n" + "".join(
        f'{r["id"]},"{r["question"]}",{r["answer"]},{r["category"]}\n' for r in shuffled
    )
    versions_seen = {
        version(jsonl(RECORDS), "gsm-small.jsonl"),
        version(jsonl(shuffled), "copy of gsm-small.jsonl"),
        version(csv_text.encode(), "gsm.csv"),
        version(parquet(shuffled), "gsm.parquet"),
        # numbers as JSON numbers read as the same text
        version(jsonl([{**r, "answer": int(r["answer"])} for r in RECORDS]), "x.jsonl"),
    }
    assert len(versions_seen) == 1


def test_a_changed_label_question_or_item_is_a_new_version() -> None:
    base = version(jsonl(RECORDS), "a.jsonl")
    relabelled = [*RECORDS[:3], {**RECORDS[3], "answer": "7"}, *RECORDS[4:]]
    reworded = [{**RECORDS[0], "question": "What's 0 + 0?"}, *RECORDS[1:]]
    recategorised = [{**RECORDS[0], "category": "sums"}, *RECORDS[1:]]
    shorter = RECORDS[1:]
    seen = [version(jsonl(rows), "a.jsonl") for rows in (relabelled, reworded, recategorised, shorter)]
    assert base not in seen and len(set(seen)) == 4


def items(rows: list[dict[str, Any]]) -> list[Item]:
    return read_items(jsonl(rows), "a.jsonl")[1]


def test_diff_names_added_removed_and_changed_items() -> None:
    a = items(RECORDS)
    b_rows = [
        {**RECORDS[0], "answer": "1"},  # label fixed
        {**RECORDS[1], "question": "What is 1 plus 1?"},  # question reworded
        {**RECORDS[2], "question": "What is 2 plus 2?", "answer": "four"},  # both
        {**RECORDS[3], "category": "sums"},  # neither
        *RECORDS[4:19],  # q19 removed
        {"id": "new", "question": "What is 100 + 1?", "answer": "101"},
    ]
    d = diff_items(a, items(b_rows))
    assert d["added"] == ["new"] and d["removed"] == ["q19"]
    assert [e["id"] for e in d["answer_changed"]] == ["q0", "q2"]
    assert [e["id"] for e in d["question_changed"]] == ["q1", "q2"]
    assert [(e["id"], e["fields"]) for e in d["other_changed"]] == [("q3", ["category"])]
    assert d["answer_changed"][0]["a"] == {"answer": "0"} and d["answer_changed"][0]["b"] == {"answer": "1"}
    assert d["unchanged"] == 15
    # diffing a version with itself, or with a shuffled copy, finds nothing
    same = diff_items(a, items(list(reversed(RECORDS))))
    assert same["added"] == same["removed"] == same["answer_changed"] == same["question_changed"] == []
    assert same["unchanged"] == 20


def test_diff_sees_changed_choices_and_messages() -> None:
    a = [
        Item(id="m", question="Pick", answer="A", choices=["x", "y"]),
        Item(id="c", messages=[ChatMessage("user", "hi")], answer="hello"),
    ]
    b = [
        Item(id="m", question="Pick", answer="A", choices=["x", "z"]),
        Item(id="c", messages=[ChatMessage("user", "hey")], answer="hello"),
    ]
    d = diff_items(a, b)
    assert [(e["id"], e["fields"]) for e in d["other_changed"]] == [("m", ["choices"])]
    assert [(e["id"], e["fields"]) for e in d["question_changed"]] == [("c", ["messages"])]


@pytest.mark.parametrize("sample", ["demo.jsonl", "demo_code.jsonl"])
def test_the_stored_copy_is_the_same_version(sample: str) -> None:
    """Reproductions read the content-addressed copy in S3: it must load back to the items
    and the content hash of the original file (HumanEval files included)."""
    original = load_dataset(sample_path(sample).read_bytes(), sample)
    digest, reread = read_items(stored_copy(original.items), "items.jsonl")
    assert digest == original.content_sha256
    assert reread == original.items


def test_stored_copy_of_conversations_and_choices_round_trips() -> None:
    rows: list[dict[str, Any]] = [
        {
            "id": "a",
            "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "2+2?"}],
            "answer": 4,
        },
        {"id": "b", "question": "Pick", "answer": "B", "choices": ["x", "y"], "meta": {"k": [1, 2]}},
    ]
    original = load_dataset(jsonl(rows), "a.jsonl")
    assert read_items(stored_copy(original.items), "items.jsonl") == (original.content_sha256, original.items)


def test_grader_versions_have_one_source() -> None:
    """The worker's graders report the versions the producer records in manifests."""
    from evalstream.worker import grading

    for name in ("auto", "numeric", "exact"):
        assert grading.grader_version(name) == graders.grader_version(name)
    assert (
        graders.grader_version("numeric")
        == f"numeric/{graders.GRADER_VERSIONS['numeric']} clean/{graders.CLEAN_VERSION}"
    )
    with pytest.raises(ValueError):
        graders.grader_version("fuzzy")


@pytest.mark.parametrize("sample", ["demo.jsonl", "demo_code.jsonl"])
def test_a_stored_copy_reads_only_as_the_items_checked_at_submission(sample: str) -> None:
    """Regrades and reproductions read the stored copy without checking it again as a
    dataset: its items must hash to the content recorded at submission, so a changed label,
    a dropped or repeated line, or a line that is no item is refused, never read."""
    from evalstream.common.regrading import StoredCopyError, copy_items

    original = load_dataset(sample_path(sample).read_bytes(), sample)
    data = stored_copy(original.items)
    assert copy_items(data, "s3://d/x", original.content_sha256) == original.items
    lines = data.splitlines(keepends=True)
    changed = json.loads(lines[0])
    changed["answer"] = "not the gold answer" if changed.get("answer") != "not the gold answer" else "x"
    for copy, why in [
        (json.dumps(changed).encode() + b"\n" + b"".join(lines[1:]), "changed"),
        (b"".join(lines[1:]), "changed"),
        (data + lines[-1], "changed"),
        (data + b'{"id": 7}\n', "no longer reads"),
        (
            data + b'{"id":"z","question":"q","meta":{"a":' + b"[" * 40 + b"]" * 40 + b"}}\n",
            "no longer reads",
        ),
    ]:
        with pytest.raises(StoredCopyError, match=why):
            copy_items(copy, "s3://d/x", original.content_sha256)
