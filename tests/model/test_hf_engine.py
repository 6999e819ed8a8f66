"""The local torch engine with the real bundled SmolLM2-135M-Instruct, on whatever device
this machine has (CPU here). Loads the model once per session from the default cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from evalstream.common.messages import ChatMessage
from evalstream.common.settings import Settings
from evalstream.worker.engines import GenOutput, bundled_model_path, load_engine
from evalstream.worker.engines.hf import HFEngine
from evalstream.worker.engines.weights import CACHE_MARKER, file_sha256
from tests.model.helpers import QUESTIONS, answers, ask

pytestmark = pytest.mark.model


@pytest.fixture
def engine(hf: HFEngine) -> HFEngine:
    return hf


def test_capital_of_france(engine: HFEngine) -> None:
    (out,) = answers(engine.generate([ask("france", "What is the capital of France?", max_tokens=32)]))
    assert "Paris" in out.text
    assert out.prompt_tokens == engine.count_tokens(engine.render_prompt([ChatMessage("user", QUESTIONS[0])]))
    assert 0 < out.completion_tokens <= 32 and not out.truncated
    assert engine.revision.startswith(file_sha256(bundled_model_path("smollm2-135m-instruct")))
    assert engine.device == "cpu" or engine.device.startswith("cuda:")


def test_second_load_comes_from_the_safetensors_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = tmp_path_factory.mktemp("model-cache")
    gguf = bundled_model_path("smollm2-135m-instruct")
    cold = HFEngine(gguf, cache_dir=cache)
    cold_text = answers(cold.generate([ask("q", "Who wrote Hamlet?", max_tokens=16)]))[0].text
    cold.close()
    warm = HFEngine(gguf, cache_dir=cache)
    warm_text = answers(warm.generate([ask("q", "Who wrote Hamlet?", max_tokens=16)]))[0].text
    warm.close()
    print(f"\ncold GGUF load {cold.load_seconds:.1f} s, warm safetensors load {warm.load_seconds:.1f} s")
    assert warm.load_seconds < cold.load_seconds
    assert warm.revision == cold.revision and warm_text == cold_text
    (entry,) = os.listdir(cache)  # no temporary folder left behind
    assert entry == cold.revision[:16] and (cache / entry / CACHE_MARKER).is_file()
    assert (cache / entry / "model.safetensors").is_file()


def test_greedy_answers_do_not_depend_on_the_batch(engine: HFEngine) -> None:
    requests = [ask(f"q{i}", q, max_tokens=48) for i, q in enumerate(QUESTIONS)]
    alone = [answers(engine.generate([r]))[0].text for r in requests]
    together = [o.text for o in answers(engine.generate(requests))]
    # and in another order, split into two batches of different widths
    evens = [o.text for o in answers(engine.generate(requests[::2][::-1]))][::-1]
    odds = [o.text for o in answers(engine.generate(requests[1::2]))]
    shuffled = [text for pair in zip(evens, odds, strict=True) for text in pair]
    same = sum(a == b == c for a, b, c in zip(alone, together, shuffled, strict=True))
    print(f"\nbatch invariance: {same}/{len(requests)} identical")
    # left padding with an attention mask, position ids from that mask (transformers does it
    # in generate) and fp32 on the CPU give the same greedy tokens: measured 12/12 with SDPA
    # and with eager attention. bf16 on a GPU may break ties differently across batch shapes.
    differing = [(a, b, c) for a, b, c in zip(alone, together, shuffled, strict=True) if not a == b == c]
    assert same == len(requests), differing


def test_throughput_of_a_batch_of_eight(engine: HFEngine) -> None:
    requests = [ask(f"q{i}", q, max_tokens=32) for i, q in enumerate(QUESTIONS[:8])]
    engine.generate(requests[:2])  # warm-up: the first call pays for kernel selection
    started = time.perf_counter()
    outs = answers(engine.generate(requests))
    elapsed = time.perf_counter() - started
    tokens = sum(o.completion_tokens for o in outs)
    print(
        f"\n8 prompts, max_tokens 32: {elapsed:.2f} s, {8 / elapsed:.2f} items/s, "
        f"{tokens / elapsed:.0f} tokens/s"
    )
    assert all(o.latency_ms > 0 for o in outs)


def test_mixed_parameters_in_one_call(engine: HFEngine) -> None:
    requests = [
        ask("short", "Write a long story about a dragon.", max_tokens=5),
        ask("stop", "Count from 1 to 20, one number per line.", max_tokens=64, stop=["5"]),
        ask("sampled", "Write a poem about the sea.", max_tokens=12, temperature=0.8, seed=3),
        ask("bad", "Hi", max_tokens=0),
    ]
    first = engine.generate(requests)
    short, stop, sampled = answers(first[:3])
    assert short.completion_tokens == 5 and short.extra["finish_reason"] == "length"
    assert "5" not in stop.text and "4" in stop.text and stop.extra["finish_reason"] == "stop"
    assert sampled.text and sampled.completion_tokens <= 12
    assert not first[3].transient and "max_tokens" in str(first[3])  # type: ignore[union-attr]
    again = engine.generate(requests[2:3])[0]
    assert isinstance(again, GenOutput) and again.text == sampled.text  # same seed, same answer


def test_a_too_long_prompt_is_truncated_and_still_answered(
    engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a small window keeps this fast on two CPU cores; the code path is the one of the real
    # 8192-token window (which takes ~26 s to prefill here)
    monkeypatch.setattr(engine, "context_window", 512)
    filler = "The quick brown fox jumps over the lazy dog. " * 300
    (out,) = answers(
        engine.generate([ask("long", filler + "\nWhat is the capital of France?", max_tokens=24)])
    )
    assert out.truncated and out.prompt_tokens == 512 - 24
    assert int(out.extra["original_prompt_tokens"]) > 3000
    assert out.text.strip()
    print(f"\ntruncated prompt answered: {out.text!r}")


def test_model_folder_spec(engine: HFEngine) -> None:
    folder = engine.model_dir
    loaded = load_engine(f"hf:{folder}", Settings(worker_model="hf:*"))
    try:
        assert isinstance(loaded, HFEngine) and loaded.revision != engine.revision  # folder fingerprint
        assert Path(loaded.model_dir) == Path(folder)
        (out,) = answers(loaded.generate([ask("france", "What is the capital of France?", max_tokens=16)]))
        assert "Paris" in out.text
    finally:
        loaded.close()
