"""The fidelity check shared by the fast test (against recorded expectations) and the slow one
(against lm-eval 0.4.13 run live): every request lm-eval builds for a task, in a canonical
form, and the same form made from the reader's items.

Canonical form, per document (doc_id order):
* multiple_choice: {"requests": [[context, continuation], ...], "gold": index}
* loglikelihood: {"requests": [[context, continuation]]}
* loglikelihood_rolling: {"requests": [[document]]}
* generate_until: {"requests": [[context, until, max_gen_toks]], "gold": target}

`python tests/lmeval_tasks/fidelity.py record` runs lm-eval (bench/.venv-lmeval) and writes
expected.json: per task the sha256 of its canonical form and the first two documents in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TASKS_DIR = HERE / "tasks"
DATA_DIR = HERE / "data"
EXPECTED = HERE / "expected.json"
# task name -> (YAML under TASKS_DIR, --num-fewshot)
TASKS: dict[str, tuple[str, int | None]] = {
    "mmlu_college_physics": ("mmlu/default/mmlu_college_physics.yaml", 5),
    "arc_easy": ("arc/arc_easy.yaml", 3),
    "gsm8k": ("gsm8k/gsm8k.yaml", None),
    "bbh_zeroshot_navigate": ("bbh/zeroshot/navigate.yaml", None),
    "bbh_fewshot_navigate": ("bbh/fewshot/navigate.yaml", None),
    "lambada_openai": ("lambada/lambada_openai.yaml", None),
    "pile_10k": ("pile_10k/pile_10k.yaml", None),
    "evalstream_local": ("evalstream_local.yaml", None),  # evalstream's own: data_files, gen_prefix
}
# group name -> its YAML under TASKS_DIR (evalstream's own group over lm-eval's tasks)
GROUPS: dict[str, str] = {"evalstream_mini": "evalstream_mini.yaml"}
LMEVAL_PYTHON = ROOT / "bench" / ".venv-lmeval" / "bin" / "python"


def canonical_from_items(task: Any) -> list[dict[str, Any]]:
    """From a RenderedTask (evalstream.common.lmeval)."""
    out: list[dict[str, Any]] = []
    for item in task.items:
        delimiter = item.meta["lm_eval"]["target_delimiter"]
        if task.output_type == "multiple_choice":
            out.append(
                {"requests": [[item.question, delimiter + c] for c in item.choices], "gold": int(item.answer)}
            )
        elif task.output_type == "loglikelihood":
            out.append({"requests": [[item.question, item.choices[0]]]})
        elif task.output_type == "loglikelihood_rolling":
            out.append({"requests": [[item.question]]})
        else:
            g = task.generation
            out.append({"requests": [[item.question, list(g.stop), g.max_tokens]], "gold": item.answer})
    return out


def canonical_from_dump(task: dict[str, Any]) -> list[dict[str, Any]]:
    """From lmeval_dump.py's output for one task."""
    by_doc: dict[int, list[dict[str, Any]]] = {}
    for r in task["requests"]:
        by_doc.setdefault(r["doc_id"], []).append(r)
    out: list[dict[str, Any]] = []
    for doc_id in sorted(by_doc):
        reqs = [r["arguments"] for r in sorted(by_doc[doc_id], key=lambda r: r["idx"])]
        kind = task["output_type"]
        if kind == "generate_until":
            ctx, kwargs = reqs[0]
            out.append(
                {
                    "requests": [[ctx, list(kwargs["until"]), kwargs.get("max_gen_toks", 256)]],
                    "gold": task["gold"][doc_id],
                }
            )
        elif kind == "multiple_choice":
            out.append({"requests": reqs, "gold": task["gold"][doc_id]})
        else:
            out.append({"requests": reqs})
    return out


def digest(canonical: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(canonical, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def run_lmeval(names: list[str], seed: int = 1234) -> dict[str, Any]:
    """lm-eval's requests for `names`, tasks or groups (run in its venv, from the tasks folder)."""
    wanted = {n: TASKS[n][1] if n in TASKS else None for n in names}
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [
            str(LMEVAL_PYTHON),
            str(HERE / "lmeval_dump.py"),
            str(TASKS_DIR),
            str(DATA_DIR),
            json.dumps(wanted),
            str(seed),
        ],
        cwd=TASKS_DIR,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"lm-eval's dump failed: {proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def record() -> None:
    dump = run_lmeval(list(TASKS))
    expected = {}
    for name in TASKS:
        canonical = canonical_from_dump(dump[name])
        expected[name] = {"sha256": digest(canonical), "docs": len(canonical), "first": canonical[:2]}
    for group in GROUPS:
        dump = run_lmeval([group])
        expected[f"group:{group}"] = {name: digest(canonical_from_dump(task)) for name, task in dump.items()}
    EXPECTED.write_text(
        json.dumps(expected, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        record()
    else:
        sys.exit(__doc__)
