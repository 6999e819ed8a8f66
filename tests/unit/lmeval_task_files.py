"""Small lm-eval task folders as the lm-eval reader's tests write them
(tests/unit/test_lmeval_reader_tasks.py, tests/unit/test_lmeval_reader_keys.py), and what they
read from the items rendered."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from evalstream.common.messages import Item


def q(item: Item) -> str:
    assert item.question is not None
    return item.question


def lm(item: Item) -> dict[str, Any]:
    assert item.meta is not None
    meta: dict[str, Any] = item.meta["lm_eval"]
    return meta


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text.startswith(BASE):  # BASE and what follows it, each dedented
            text = textwrap.dedent(BASE) + textwrap.dedent(text[len(BASE) :])
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def rows(n: int, **extra: Any) -> str:
    return "".join(
        json.dumps(
            {"q": f"question {i}", "a": f"answer {i}", "label": i % 3, "opts": ["x", "y", "z"], **extra}
        )
        + "\n"
        for i in range(n)
    )


BASE = """\
    dataset_path: json
    dataset_kwargs:
      data_files:
        train: train.jsonl
        test: test.jsonl
    test_split: test
    """
