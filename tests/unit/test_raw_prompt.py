"""Raw prompts (JobSpec/Shard.raw_prompt, set for every `evalctl submit --task` run): the
producer copies the job's flag to every shard, the worker sends each item's question exactly
(no system prompt, prompt template or chat template; an API model through its completions
endpoint), a raw answer never shares a cache key with a chat prompt of the same text, the
tokenizer engines cut a long raw prompt from the left as lm-eval does, and the manifest
records it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import pytest

from evalstream.common.jobs import job_problems
from evalstream.common.messages import ChatMessage, GenerationParams, Item, JobSpec, Shard
from evalstream.common.settings import WorkerSettings
from evalstream.producer.sharding import make_shards
from evalstream.worker.engines import load_engine
from evalstream.worker.engines.base import EngineError, GenOutput, GenRequest
from evalstream.worker.engines.null import NullEngine
from evalstream.worker.engines.tokenizer_engine import PreparedRequest, TokenizerEngine
from evalstream.worker.runner import ModelRunner, RunnerConfig
from tests.fakes.openai_provider import FakeProvider

QUESTION = "Question: What is 2 + 3?\nAnswer:"


class RecordingEngine:
    """Renders a chat as `<chat>` + the messages (or, `identity`, the last message's text
    alone: a chat prompt whose text is a raw prompt's); answers "5"; records requests."""

    name = "hf:recording"
    revision = "rev-1"
    cacheable = True
    device = "cpu"

    def __init__(self, identity: bool = False) -> None:
        self.identity = identity
        self.requests: list[GenRequest] = []

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        if self.identity:
            return messages[-1].content
        return "<chat>" + "|".join(f"{m.role}:{m.content}" for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        self.requests += requests
        return [GenOutput(text="5", prompt_tokens=3, completion_tokens=1) for _ in requests]

    def close(self) -> None:
        pass


class MemoryCache:
    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}

    async def get_many(self, keys: list[str]) -> dict[str, Any]:
        return {k: self.entries[k] for k in keys if k in self.entries}

    async def put_many(self, entries: list[tuple[str, str, Any]]) -> None:
        for key, _model, answer in entries:
            self.entries.setdefault(key, answer)


def shard(items: list[Item], *, raw: bool, shard_id: str = "run-r-s00000", **extra: Any) -> Shard:
    return Shard(
        run_id="run-r", shard_id=shard_id, shard_index=0, shard_count=1, model="hf:recording",
        grader="exact", generation=GenerationParams(max_tokens=8), items=items, raw_prompt=raw, **extra,
    )  # fmt: skip


def run(engine: RecordingEngine, shards: list[Shard], cache: MemoryCache | None = None) -> Any:
    runner = ModelRunner(RunnerConfig(group="g"), lambda _spec: engine, cache)  # type: ignore[arg-type,return-value]
    return asyncio.run(runner.run(shards))


def test_the_producer_copies_the_flag_to_every_shard() -> None:
    items = [Item(id=str(i), question="q", answer="a") for i in range(5)]
    job = JobSpec(dataset="s3://b/k.jsonl", model="null", shard_size=2, raw_prompt=True)
    shards = make_shards("run-r", job, items)
    assert len(shards) == 3 and all(s.raw_prompt for s in shards)
    assert not any(s.raw_prompt for s in make_shards("run-r", JobSpec(dataset="s3://b/k.jsonl"), items))


def test_a_raw_job_takes_no_template_or_system_prompt() -> None:
    base = JobSpec(dataset="s3://b/k.jsonl", model="null", raw_prompt=True)
    assert not job_problems(base)
    for job in (
        msgspec.structs.replace(base, prompt_template="Q: {question}"),
        msgspec.structs.replace(base, system_prompt="Be brief."),
    ):
        assert [p.field for p in job_problems(job)] == ["raw_prompt"]


def test_the_worker_sends_the_question_exactly() -> None:
    engine = RecordingEngine()
    item = Item(id="1", question=QUESTION, answer="5")
    # a template and a system prompt on the shard (intake refuses them with a raw prompt) are ignored
    out = run(engine, [shard([item], raw=True, prompt_template="Q: {question}", system_prompt="Be brief.")])
    (request,) = engine.requests
    assert request.prompt == QUESTION and request.messages == [ChatMessage("user", QUESTION)]
    (result,) = out.results["run-r-s00000"]
    assert result.prompt == QUESTION and result.response == "5" and result.correct
    engine = RecordingEngine()
    out = run(engine, [shard([item], raw=False, system_prompt="Be brief.")])
    (request,) = engine.requests
    assert request.prompt is None and request.messages[0] == ChatMessage("system", "Be brief.")
    assert out.results["run-r-s00000"][0].prompt.startswith("<chat>system:Be brief.|user:")


def test_an_item_without_a_question_fails_for_good() -> None:
    engine = RecordingEngine()
    chat = Item(id="c", messages=[ChatMessage("user", "hi")], answer="x")
    out = run(engine, [shard([chat, Item(id="q", question=QUESTION, answer="5")], raw=True)])
    (failure,) = out.failures
    assert failure.item.id == "c" and not failure.transient and "has none (messages only)" in failure.error
    assert [r.item_id for r in out.results["run-r-s00000"]] == ["q"]


def test_a_raw_answer_never_shares_a_key_with_a_chat_prompt_of_the_same_text() -> None:
    engine = RecordingEngine(identity=True)  # the chat prompt's text is the question itself
    cache = MemoryCache()
    item = Item(id="1", question=QUESTION, answer="5")
    run(engine, [shard([item], raw=True)], cache)
    run(engine, [shard([item], raw=False)], cache)
    assert len(cache.entries) == 2 and len(engine.requests) == 2  # the second was not a hit
    out = run(engine, [shard([item], raw=True, shard_id="run-r-s00001")], cache)
    assert out.results["run-r-s00001"][0].cache_hit and len(engine.requests) == 2


# ---- the tokenizer engines (hf:, ov:): the raw text as it is, cut from the left


class CharTokenizer:
    """One token per character; the chat template wraps the last message."""

    chat_template = "wrap"
    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
        return f"<s>{messages[-1]['content']}</s>"


class PreparingEngine(TokenizerEngine):
    def __init__(self, context_window: int) -> None:
        self.tokenizer = CharTokenizer()
        self.context_window = context_window
        self._lock = threading.Lock()
        self.prepared: list[PreparedRequest] = []

    def _generate_group(self, group: list[PreparedRequest]) -> Sequence[GenOutput | EngineError]:
        self.prepared += group
        return [GenOutput(text="") for _ in group]


def test_tokenizer_engines_encode_a_raw_prompt_as_it_is_and_cut_it_from_the_left() -> None:
    engine = PreparingEngine(context_window=12)
    params = GenerationParams(max_tokens=2)
    chat = GenRequest("c", [ChatMessage("user", "abc")], params)
    raw = GenRequest("r", [ChatMessage("user", "abc")], params, prompt="abc")
    long_raw = GenRequest("l", [], params, prompt="0123456789xyz")  # 13 tokens, room for 10
    engine.generate([chat, raw, long_raw])
    texts = ["".join(map(chr, p.ids)) for p in engine.prepared]
    assert texts == ["<s>abc</s>", "abc", "3456789xyz"]  # lm-eval keeps a context's tail
    assert engine.prepared[2].original_tokens == 13


def test_the_null_engine_counts_a_raw_prompt() -> None:
    (out,) = NullEngine().generate([GenRequest("1", [], GenerationParams(), prompt="a b c")])
    assert isinstance(out, GenOutput) and out.prompt_tokens == 3


# ---- openai: the completions endpoint


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as p:
        yield p


def test_openai_sends_a_raw_prompt_to_the_completions_endpoint(provider: FakeProvider) -> None:
    engine = load_engine(provider.spec(), WorkerSettings(worker_model="openai:*"))
    params = GenerationParams(max_tokens=9, stop=["Question:"])
    try:
        raw, chat = engine.generate(
            [
                GenRequest("r", [ChatMessage("user", "x")], params, prompt="What is 2 + 3?"),
                GenRequest("c", [ChatMessage("user", "What is 2 + 4?")], params),
            ]
        )
    finally:
        engine.close()
    assert isinstance(raw, GenOutput) and raw.text == "5" and raw.completion_tokens == 1
    assert isinstance(chat, GenOutput) and chat.text == "6"
    # "5" came from the completions route: the fake answers a chat route without messages "ok"
    text = next(r.body for r in provider.requests if "prompt" in (r.body or {}))
    messages = next(r.body for r in provider.requests if "messages" in (r.body or {}))
    assert text == {
        "model": "fake-model", "prompt": "What is 2 + 3?", "max_tokens": 9, "temperature": 0.0,
        "top_p": 1.0, "stop": ["Question:"],
    }  # fmt: skip
    assert (
        messages is not None
        and "prompt" not in messages
        and messages["messages"][0]["content"] == "What is 2 + 4?"
    )
