"""Run by lm-eval's own venv (bench/.venv-lmeval, see bench/against_lmeval.py): builds lm-eval
0.4.13's tasks from a folder of task YAMLs with its TaskManager and prints, per task, its
requests' arguments as lm-eval's `build_all_requests` makes them, as JSON on stdout.

    python lmeval_dump.py TASKS_DIR DATA_DIR '{"task_name": num_fewshot or null, ...}' [SEED]

Hub dataset names are read from local files as evalctl's `--data-dir` reads them
(DATA_DIR/<dataset_path>/<dataset_name>/<split>.<ext>): `datasets.load_dataset` is wrapped
so, and nothing else of lm-eval changes. The working directory should be the task's folder
(lm-eval reads relative data_files from there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets

EXTS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_original = datasets.load_dataset


def local_load_dataset(data_dir: Path) -> Any:
    def load(path: str | None = None, name: str | None = None, **kwargs: Any) -> Any:
        if path in ("json", "csv", "parquet") or path is None:
            return _original(path=path, name=name, **kwargs)
        kwargs.pop("trust_remote_code", None)
        folder = data_dir / path / (name or "")
        if kwargs.get("data_files") is not None:  # a hub name with data_files: files of its repo
            files = kwargs.pop("data_files")
            files = (
                {k: str(data_dir / path / v) for k, v in files.items()} if isinstance(files, dict) else files
            )
            builder = EXTS[Path(next(iter(files.values())) if isinstance(files, dict) else files).suffix]
            return _original(path=builder, data_files=files, **kwargs)
        files = {p.stem: str(p) for p in sorted(folder.iterdir()) if p.suffix in EXTS and p.is_file()}
        builder = EXTS[Path(next(iter(files.values()))).suffix]
        return _original(path=builder, data_files=files, **kwargs)

    return load


def main() -> None:
    tasks_dir, data_dir, wanted = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 1234
    datasets.load_dataset = local_load_dataset(data_dir)
    import lm_eval.api.task

    lm_eval.api.task.datasets.load_dataset = datasets.load_dataset  # the module's own reference
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    loaded = tm.load(list(wanted))
    out: dict[str, Any] = {}
    for name, task in loaded["tasks"].items():
        num_fewshot = wanted.get(name, wanted.get(next(iter(wanted))) if len(wanted) == 1 else None)
        # lm_eval.evaluator.simple_evaluate's handling of num_fewshot and the few-shot seed
        if num_fewshot is not None:
            if task.get_config("num_fewshot") != 0:
                task.set_config(key="num_fewshot", value=num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
        task.build_all_requests(rank=0, world_size=1, cache_requests=False)
        requests = [
            {
                "doc_id": inst.doc_id,
                "idx": inst.idx,
                "request_type": inst.request_type,
                "arguments": list(inst.arguments),
            }
            for inst in task.instances
        ]
        gold = []
        for doc_id, doc in enumerate(task.eval_docs):
            target = task.doc_to_target(doc)
            if task.config.output_type == "multiple_choice":
                choices = task.doc_to_choice(doc)
                gold.append(choices.index(target) if isinstance(target, str) else target)
            elif task.config.output_type == "generate_until":
                gold.append(task.doc_to_choice(doc)[target] if task.config.doc_to_choice else str(target))
            else:
                gold.append(None)
            del doc_id
        out[name] = {"output_type": task.config.output_type, "requests": requests, "gold": gold}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
