"""lm-eval's own CLI (`lm_eval run ...`, lm_eval.__main__.cli_evaluate), run by its venv
(bench/.venv-lmeval) with one change: hub dataset names read from local files, as
`evalctl submit --data-dir` reads them (DATA_DIR/<dataset_path>/<dataset_name>/<split>.<ext>;
tests/lmeval_tasks/lmeval_dump.py local_load_dataset), since the hub is not reachable here.

    python run_lmeval.py DATA_DIR run --model hf --tasks ... (lm_eval's arguments)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    data_dir = Path(sys.argv[1])
    sys.path.insert(0, str(ROOT))
    import datasets
    import lm_eval.api.task

    from tests.lmeval_tasks.lmeval_dump import local_load_dataset

    datasets.load_dataset = local_load_dataset(data_dir)
    lm_eval.api.task.datasets.load_dataset = datasets.load_dataset
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *sys.argv[2:]]
    cli_evaluate()


if __name__ == "__main__":
    main()
