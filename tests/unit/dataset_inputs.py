"""Datasets and helpers that the dataset tests share (tests/unit/test_datasets_reading.py,
tests/unit/test_datasets_problems.py): records in JSONL and Parquet, and the problems a
refused input carries."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalstream.common.datasets import DatasetError, Problem, load_dataset

RECORDS: list[dict[str, Any]] = [
    {"id": "q1", "question": "What is 2 + 3?", "answer": "5", "category": "arithmetic"},
    {"id": "q2", "question": "Capital of France?", "answer": "Paris", "choices": ["Paris", "Rome"]},
    {"id": "q3", "question": "Colour of the sky?", "answer": "blue", "meta": {"source": "demo", "level": 1}},
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


def parquet(records: list[dict[str, Any]], schema: pa.Schema | None = None) -> bytes:
    """(pa.Table.from_pylist takes its columns from the first row only, hence from_pydict.)"""
    names = list(dict.fromkeys(k for r in records for k in r)) if schema is None else schema.names
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pydict({n: [r.get(n) for r in records] for n in names}, schema=schema), buf)
    return buf.getvalue()


def problems_of(data: bytes, filename: str, **kw: Any) -> list[Problem]:
    with pytest.raises(DatasetError) as info:
        load_dataset(data, filename, **kw)
    assert info.value.problems, "a DatasetError must carry at least one problem"
    return info.value.problems


def one_problem(data: bytes, filename: str, **kw: Any) -> Problem:
    problems = problems_of(data, filename, **kw)
    assert len(problems) == 1, problems
    return problems[0]
