"""The default model's engine in this process, exactly as a worker loads it: prepared
requests, planned batches, engine-call counters and the answers stored by a run."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.benchstack import client_env, metrics
from bench.harness.paths import DEFAULT_MODEL
from bench.harness.pure import metric_sum


def load_engine(spec: str = DEFAULT_MODEL) -> Any:
    """The engine of `spec` (default: the default model's HFEngine) exactly as a worker loads
    it (same cached safetensors or OpenVINO IR)."""
    from evalstream.common.settings import Settings
    from evalstream.worker.engines import load_engine as _load

    return _load(spec, Settings.from_env())


@dataclass
class Prepared:
    requests: list[Any]  # GenRequest
    prompt_tokens: list[int]
    max_new: list[int]


def prepare(
    engine: Any,
    rows: Sequence[Mapping[str, Any]],
    max_tokens: int | Sequence[int],
    grader: str = "exact",
    prompt_template: str | None = None,
) -> Prepared:
    """GenRequests for `rows` rendered as a worker renders them for a job with `grader` and
    `prompt_template` (None: the grader's default; the model's chat template around it),
    and their prompt lengths in tokens."""
    from evalstream.common.messages import GenerationParams, Item, Shard
    from evalstream.worker.engines.base import GenRequest
    from evalstream.worker.grading import resolve_grader
    from evalstream.worker.prompting import build_messages

    items = [Item(id=str(r["id"]), question=r["question"], answer=str(r.get("answer"))) for r in rows]
    per_item = [max_tokens] * len(items) if isinstance(max_tokens, int) else list(max_tokens)
    shard = Shard(
        run_id="bench",
        shard_id="bench-0",
        shard_index=0,
        shard_count=1,
        model=DEFAULT_MODEL,
        grader=grader,
        generation=GenerationParams(max_tokens=per_item[0] if per_item else 1),
        items=items,
        prompt_template=prompt_template,
    )
    requests, lengths = [], []
    for item, mt in zip(items, per_item, strict=True):
        messages = build_messages(shard, item, resolve_grader(grader, item))
        lengths.append(engine.count_tokens(engine.render_prompt(messages)))
        requests.append(
            GenRequest(item_id=item.id, messages=messages, params=GenerationParams(max_tokens=mt))
        )
    return Prepared(requests, lengths, per_item)


@dataclass
class EngineRun:
    items: int
    seconds: float
    batches: list[list[int]]
    completion_tokens: int
    outputs: list[Any]

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0


def run_engine(engine: Any, prepared: Prepared, batches: Sequence[Sequence[int]]) -> EngineRun:
    """engine.generate over `batches` (indices into prepared.requests), timed."""
    outputs: list[Any] = [None] * len(prepared.requests)
    t0 = time.perf_counter()
    for batch in batches:
        outs = engine.generate([prepared.requests[i] for i in batch])
        for i, o in zip(batch, outs, strict=True):
            outputs[i] = o
    seconds = time.perf_counter() - t0
    tokens = sum(getattr(o, "completion_tokens", 0) for o in outputs)
    return EngineRun(len(prepared.requests), seconds, [list(b) for b in batches], tokens, outputs)


def default_plan(prepared: Prepared, engine: Any = None) -> list[list[int]]:
    """The worker's batching plan with the worker's settings (BATCH_TOKEN_BUDGET, BATCH_MAX_ITEMS,
    else the measured defaults of `engine`'s kind and device; the default model's hf engine on
    the CPU when no engine is given)."""
    from evalstream.common.settings import Settings
    from evalstream.worker.batching import plan_batches

    s = Settings.from_env()
    budget, items = (
        s.batch_limits(engine.name, engine.device) if engine else s.batch_limits(DEFAULT_MODEL, "cpu")
    )
    return plan_batches(
        prepared.prompt_tokens,
        token_budget=budget,
        max_items=items,
        max_new_tokens=prepared.max_new,
    )


def engine_calls(name: str = "worker-0") -> dict[str, float]:
    """Counters that move when a worker calls its engine: batches (the batch-size histogram's
    count), tokens generated, and engine requests where that counter exists."""
    m = metrics(name)
    return {
        "batches": metric_sum(m, "evalstream_batch_size_count"),
        "tokens_out": metric_sum(m, "evalstream_tokens_total", direction="out"),
        "tokens_in": metric_sum(m, "evalstream_tokens_total", direction="in"),
        "engine_requests": metric_sum(m, "evalstream_engine_requests_total"),
        "engine_busy_s": metric_sum(m, "evalstream_engine_busy_seconds_total"),
    }


def delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


def clear_answer_cache() -> int:
    """Empties the bench stack's answer cache (a cold start for the next run), as the owner of
    the tables (the users' role only reads); returns the number of answers removed."""

    async def go() -> int:
        import asyncpg

        conn = await asyncpg.connect(client_env("admin")["DATABASE_URL"])
        try:
            status = await conn.execute("DELETE FROM answer_cache")
            return int(status.split()[-1])
        finally:
            await conn.close()

    return asyncio.run(go())


def responses(run_id: str) -> dict[str, str | None]:
    """item_id -> response of a run's results."""

    async def go() -> dict[str, str | None]:
        import asyncpg

        conn = await asyncpg.connect(os.environ["DATABASE_URL"])
        try:
            rows = await conn.fetch("SELECT item_id, response FROM item_results WHERE run_id = $1", run_id)
            return {r["item_id"]: r["response"] for r in rows}
        finally:
            await conn.close()

    return asyncio.run(go())


def same_answers(prepared: Prepared, outputs: Sequence[Any], stored: Mapping[str, str | None]) -> float:
    """Share of items whose in-process answer equals the pipeline's stored response."""
    same = sum(
        1
        for req, out in zip(prepared.requests, outputs, strict=True)
        if getattr(out, "text", None) is not None and stored.get(req.item_id) == out.text
    )
    return same / len(prepared.requests) if prepared.requests else 0.0


def pipeline_prompt(model_dir: Path | str, rows: list[dict[str, Any]], like: str | None) -> str | None:
    """The prompt a worker renders for the row that `like` (lm-eval's first prompt) asks,
    through the worker's own message building and the model's chat template."""
    from transformers import AutoTokenizer

    from evalstream.common.messages import GenerationParams, Item, Shard
    from evalstream.worker.prompting import build_messages

    row = next((r for r in rows if like and r["question"] in like), rows[0])
    item = Item(id=row["id"], question=row["question"], answer=row["answer"])
    shard = Shard(
        run_id="x",
        shard_id="x",
        shard_index=0,
        shard_count=1,
        model=DEFAULT_MODEL,
        grader="exact",
        generation=GenerationParams(),
        items=[item],
    )
    messages = build_messages(shard, item, "exact")
    tok = AutoTokenizer.from_pretrained(model_dir)
    return str(
        tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )
    )
