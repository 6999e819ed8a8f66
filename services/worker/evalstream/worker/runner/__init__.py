"""The model runner: shards in, per-item outcomes out (model_runner.py). Knows nothing of
Kafka.

    items.py         the work: items waiting for an engine, regrades, scoring items, outcomes;
                     shards prepared into them (prompts, cache keys)
    model_runner.py  ModelRunner: cache, batches, engine calls, the order of it all
    scoring.py       items of a scoring grader, scored instead of answered
    grading.py       answers graded (grading pool, threads) into result rows
"""

from __future__ import annotations

from evalstream.worker.runner.grading import BLOCKING_GRADERS, GRADING_THREADS
from evalstream.worker.runner.items import Failure, Outcome
from evalstream.worker.runner.model_runner import ModelRunner, RunnerConfig, start_runner

__all__ = [
    "BLOCKING_GRADERS",
    "GRADING_THREADS",
    "Failure",
    "ModelRunner",
    "Outcome",
    "RunnerConfig",
    "start_runner",
]
