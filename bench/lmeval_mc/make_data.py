"""Builds bench/lmeval_mc/data (committed): BIG-bench's `date_understanding` task (369
multiple-choice questions, from the `bigbench` 1.0.0 sdist on PyPI,
bigbench/benchmark_tasks/date_understanding/task.json) in the columns of the hub's
`hails/bigbench` dataset that lm-eval's bigbench YAMLs read (idx, inputs, targets,
multiple_choice_targets, multiple_choice_scores), zero-shot, laid out for `--data-dir`:
data/hails/bigbench/date_understanding_zero_shot/default.jsonl.

`inputs` is written as BIG-bench's JSON-task formatter writes a zero-shot example
(bigbench/api/json_task.py default_format_fn with its default prefixes "\\nQ: " and
"\\nA: ", the task prefix before it, stripped of the surrounding whitespace); the choices
keep the task file's order. No document lacks multiple_choice_targets (lm-eval's
`filter_multiple_choice`, removed from the bench's template copy, would drop none).

Run: `python bench/lmeval_mc/make_data.py BIGBENCH_SDIST_DIR` (the unpacked sdist).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASK = "date_understanding"
OUT = HERE / "data" / "hails" / "bigbench" / f"{TASK}_zero_shot" / "default.jsonl"


def main(bigbench: Path) -> None:
    task = json.loads(
        (bigbench / "bigbench/benchmark_tasks" / TASK / "task.json").read_text(encoding="utf-8")
    )
    prefix = task.get("task_prefix", "")
    q, a = task.get("example_input_prefix", "\nQ: "), task.get("example_output_prefix", "\nA: ")
    rows = []
    for i, ex in enumerate(task["examples"]):
        scores = ex["target_scores"]
        best = max(scores.values())
        target = next(k for k, v in scores.items() if v == best)
        inputs = (prefix + q + ex["input"] + a).strip()
        rows.append(
            {
                "idx": i,
                "inputs": inputs,
                "targets": [target],
                "multiple_choice_targets": list(scores),
                "multiple_choice_scores": [int(v) for v in scores.values()],
            }
        )
    assert all(r["multiple_choice_targets"] for r in rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} documents -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
