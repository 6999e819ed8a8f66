"""Jobs: the checks every job passes before anything is published, run ids, and publishing a
job with its trace context. The producer's intake and every evalctl command that starts a
run (submit, reproduce, regrade) use these, so a job is checked, named and traced one way.
"""

from __future__ import annotations

import re
import secrets
import time

from aiokafka import AIOKafkaProducer
from msgspec import Struct

from evalstream.common import intake_limits, telemetry, topics
from evalstream.common.datasets import Problem
from evalstream.common.graders import grader_problem
from evalstream.common.kafka_security import client_kwargs
from evalstream.common.messages import JobSpec, encode
from evalstream.common.settings import KafkaSettings
from evalstream.common.specs import spec_problem

MAX_SHARD_SIZE = 1000
RUN_ID = re.compile(r"run-\d{8}-\d{6}-[0-9a-f]{8}")  # what new_run_id makes


def new_run_id() -> str:
    """A run id that sorts by creation time and does not collide: run-20260101-120000-1a2b3c4d."""
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def job_problems(job: JobSpec) -> list[Problem]:
    """Everything wrong with the job apart from its dataset."""
    out = [
        Problem(line=None, field=f, message=m)
        for f, m in (
            ("model", spec_problem(job.model)),
            ("grader", grader_problem(job.grader)),
        )
        if m
    ]
    out += [Problem(line=None, field="generation", message=m) for m in job.generation.problems()]
    if job.shard_size is not None and not 1 <= job.shard_size <= MAX_SHARD_SIZE:
        out.append(
            Problem(line=None, field="shard_size", message=f"shard_size must be in 1..{MAX_SHARD_SIZE}")
        )
    out += [Problem(line=None, field="retry", message=m) for m in job.retry.problems()]
    out += [Problem(line=None, field=f, message=m) for f, m in intake_limits.job_limit_problems(job)]
    if (
        job.prompt_template is not None
        and "{question}" not in job.prompt_template
        and "{prompt}" not in job.prompt_template
    ):
        out.append(
            Problem(line=None, field="prompt_template", message="template has no {question} placeholder")
        )
    if job.raw_prompt and (job.prompt_template is not None or job.system_prompt is not None):
        out.append(
            Problem(
                line=None,
                field="raw_prompt",
                message="a raw prompt is the question alone: no prompt_template or system_prompt with it",
            )
        )
    return out


async def publish_job(settings: KafkaSettings, job: JobSpec) -> None:
    """Publishes `job` (with its run id) to eval.jobs. The run's trace starts here."""
    if job.run_id is None:
        raise ValueError("publish_job needs a job with a run_id (new_run_id())")
    await publish_traced(settings, topics.JOBS, job, job.run_id)


async def publish_traced(settings: KafkaSettings, topic: str, message: Struct, run_id: str) -> None:
    """Publishes `message` keyed by `run_id`, durably (acks=all, idempotent), in a send span
    whose context travels in the message's headers."""
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        with telemetry.send_span(topic, run_id) as headers:
            await producer.send_and_wait(topic, encode(message), key=run_id.encode(), headers=headers)
    finally:
        await producer.stop()
