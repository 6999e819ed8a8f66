"""The README's promise that any Kafka client can start a run: a job written by hand and
published with Kafka's own console producer (org.apache.kafka.tools.ConsoleProducer,
`ops/local/kafka-console-producer.sh`) completes; a misspelt field rejects the run with the
field named and publishes nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import asyncpg
import pytest

from evalstream.common import storage, topics
from evalstream.common.settings import Settings
from tests.e2e.helpers import ROOT, evalctl, run_status
from tests.support import read_topic_since, topic_end_offsets, unique, wait_until

pytestmark = pytest.mark.stack

CONSOLE_PRODUCER = ROOT / "ops/local/kafka-console-producer.sh"


def console_produce(settings: Settings, line: str) -> None:
    """One message on eval.jobs, exactly as a user would send it from a shell."""
    proc = subprocess.run(
        [str(CONSOLE_PRODUCER), "--bootstrap-server", settings.kafka_bootstrap, "--topic", topics.JOBS],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=300,  # the first call fetches the kafka-tools jars from Maven Central
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def upload(settings: Settings, key: str, text: str) -> str:
    storage.put_bytes(
        storage.client(settings), settings.s3_bucket_datasets, key, text.encode(), "application/x-ndjson"
    )
    return f"s3://{settings.s3_bucket_datasets}/{key}"


QUESTIONS = (
    '{"id": "q1", "question": "What is the capital of France?", "answer": "Paris"}\n'
    '{"id": "q2", "question": "What is 2 + 2?", "answer": "4"}\n'
    '{"id": "q3", "question": "What colour is the sky on a clear day?", "answer": "blue"}\n'
)


async def test_hand_written_job_from_the_console_producer_completes(
    stack: Settings, pg: asyncpg.Connection, tmp_path: Path
) -> None:
    dataset = upload(stack, f"uploads/{unique('hand')}/qa.jsonl", QUESTIONS)
    # The README's minimal job: only the dataset and the model, no run_id (the producer
    # derives one from the message's place in Kafka).
    console_produce(stack, f'{{"dataset": "{dataset}", "model": "null"}}')

    async def run_of_job() -> str | None:
        return await pg.fetchval("SELECT run_id FROM runs WHERE dataset_uri = $1", dataset)

    run_id = await wait_until(run_of_job, 120, what="the producer to take the hand-written job")

    async def completed() -> bool:
        return await run_status(pg, run_id) == "completed"

    await wait_until(completed, 300, what=f"run {run_id} to complete")
    rows = await pg.fetch(
        "SELECT item_id, error FROM item_results WHERE run_id = $1 ORDER BY item_id", run_id
    )
    assert [(r["item_id"], r["error"]) for r in rows] == [("q1", None), ("q2", None), ("q3", None)]
    report = json.loads(evalctl("report", run_id, "--json").stdout.splitlines()[-1])
    assert (report["total"], report["succeeded"], report["failed"]) == (3, 3, 0)
    assert report["model"] == "null"


async def test_misspelt_field_rejects_the_run_naming_the_field(
    stack: Settings, pg: asyncpg.Connection
) -> None:
    dataset = upload(stack, f"uploads/{unique('hand')}/qa.jsonl", QUESTIONS)
    run_id = unique("run-misspelt")
    shards_before = await topic_end_offsets(topics.SHARDS)
    console_produce(
        stack,
        json.dumps({"dataset": dataset, "model": "null", "run_id": run_id, "generation": {"max_token": 64}}),
    )

    async def decided() -> bool:
        return await run_status(pg, run_id) not in (None, "validating")

    await wait_until(decided, 120, what="the producer to decide on the misspelt job")
    assert await run_status(pg, run_id) == "rejected"
    problems = json.loads(await pg.fetchval("SELECT problems FROM runs WHERE run_id = $1", run_id))
    assert [p["field"] for p in problems] == ["generation.max_token"]
    assert "did you mean 'max_tokens'" in problems[0]["message"]
    # the user sees it where they look
    status = json.loads(evalctl("status", run_id, "--json").stdout.splitlines()[-1])
    assert status["status"] == "rejected" and "max_token" in status["problems"][0]["message"]
    # nothing of it was published or recorded
    published = await read_topic_since(topics.SHARDS, shards_before)
    assert not [v for _, v, _ in published if run_id.encode() in v]
    assert await pg.fetchval("SELECT count(*) FROM item_results WHERE run_id = $1", run_id) == 0
