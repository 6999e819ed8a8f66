"""The grading pool's cost on the normal path: ordinary answers graded inline (in the
worker's process, as before issue 12) and through the pool, per item. Prints JSON.

    .venv/bin/python bench/grading_pool.py [--items 5000] [--processes 2] [--repeat 3]

`wall_us` is per item for a batch of --items; `parent_cpu_us` is the worker process's own CPU
per item (inline: the grading itself; pool: sending, receiving and decoding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from evalstream.common.messages import Item
from evalstream.worker.grading import get_grader
from evalstream.worker.grading_pool import GradeTask, GradingPool

CASES = {
    "numeric": (Item(id="n", question="q", answer="42"), "3 + 4 = 7, and 7 * 6 = 42.\n#### {i}"),
    "exact": (Item(id="e", question="q", answer="Paris"), "The capital of France is Paris {i}."),
    "choice": (Item(id="c", question="q", answer="B", choices=["x", "y", "z"]), "The answer is B ({i})"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pool = GradingPool(args.processes, timeout_s=5.0, memory_bytes=1024**3)
    started = time.perf_counter()
    pool.start()
    out: dict[str, object] = {"pool_start_s": round(time.perf_counter() - started, 3), "items": args.items}
    for name, (item, template) in CASES.items():
        tasks = [GradeTask(name, template.format(i=i), item) for i in range(args.items)]
        grader = get_grader(name, item)
        runs: dict[str, list[tuple[float, float]]] = {"inline": [], "pool": []}
        for _ in range(args.repeat):
            for mode in runs:
                wall, cpu = time.perf_counter(), time.process_time()
                if mode == "inline":
                    [grader(t.response, item) for t in tasks]
                else:
                    pool.grade(tasks)
                runs[mode].append((time.perf_counter() - wall, time.process_time() - cpu))
        out[name] = {
            mode: {
                "wall_us": round(statistics.median(w for w, _ in r) / args.items * 1e6, 1),
                "parent_cpu_us": round(statistics.median(c for _, c in r) / args.items * 1e6, 1),
            }
            for mode, r in runs.items()
        }
    pool.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
