"""The `ov:` engine (OpenVINO GenAI continuous batching) with the real bundled SmolLM2-135M,
on the CPU: conversion exactness, the hf engine's guarantees, agreement with the hf engine.

The IR is converted once into the default model cache (about a minute on two cores) and
reused by later sessions; the engines are loaded once per module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from evalstream.common.settings import Settings
from evalstream.worker.engines import GenOutput, bundled_model_path, load_engine
from evalstream.worker.engines.hf import HFEngine
from evalstream.worker.engines.ov import OpenVINOEngine
from evalstream.worker.engines.ov_convert import IR_MARKER, IR_XML
from evalstream.worker.engines.weights import file_sha256
from tests.model.helpers import QUESTIONS as HF_QUESTIONS
from tests.model.helpers import answers, ask

pytestmark = pytest.mark.model

# The fixed prompt set of the agreement test: the hf engine's test questions and arithmetic
# of the kind the benchmark asks.
QUESTIONS = [
    *HF_QUESTIONS,
    *(f"What is {a} + {b}?\n\nAnswer in a few words." for a, b in [(17, 3), (5, 9), (120, 7), (41, 58)]),
    *(f"What is {a} * {b}?\n\nAnswer in a few words." for a, b in [(6, 7), (12, 11), (3, 15), (25, 4)]),
]
# Greedy answers identical to the hf engine's, out of len(QUESTIONS), at least: the issue's
# bar (95 %), rounded down. Measured on this machine: see test_agrees_with_the_hf_engine.
AGREEMENT_FLOOR = 0.95


@pytest.fixture(scope="module")
def engine() -> Iterator[OpenVINOEngine]:
    loaded = load_engine("ov:smollm2-135m-instruct", Settings.from_env())
    assert isinstance(loaded, OpenVINOEngine)
    yield loaded
    loaded.close()


def test_the_ir_holds_the_hf_engines_fp32_weights_bit_for_bit(engine: OpenVINOEngine, hf: HFEngine) -> None:
    """Read back from disk, independently of the converter's own check: every tensor of the
    safetensors file the hf engine loads is an fp32 constant of the IR with the same bytes
    (norm weights reshaped for broadcasting), and no weight was stored in a 16-bit type."""
    import openvino
    from safetensors.numpy import load_file

    tensors = load_file(Path(hf.model_dir) / "model.safetensors")
    ir = openvino.Core().read_model(engine.ir_dir / IR_XML)
    by_size: dict[int, list[np.ndarray]] = {}
    narrow = 0
    for op in ir.get_ops():
        if op.get_type_name() != "Constant":
            continue
        kind = op.get_output_element_type(0).get_type_name()
        data = op.get_data()
        if kind in ("f16", "bf16") and data.size > 1:
            narrow += 1
        if kind == "f32":
            by_size.setdefault(data.size, []).append(data)
    assert narrow == 0
    missing = [
        name
        for name, t in tensors.items()
        if not any(
            np.array_equal(c.reshape(-1), t.reshape(-1))
            or (t.ndim == 2 and np.array_equal(c.reshape(-1), t.T.reshape(-1)))
            for c in by_size.get(t.size, [])
        )
    ]
    assert tensors and not missing, missing
    marker = json.loads((engine.ir_dir / IR_MARKER).read_text())
    assert marker["weights_id"] == file_sha256(bundled_model_path("smollm2-135m-instruct"))
    assert marker["weights_checked"] >= len(tensors)


def test_revision_names_the_weights_the_engine_and_its_precisions(
    engine: OpenVINOEngine, hf: HFEngine
) -> None:
    weights = file_sha256(bundled_model_path("smollm2-135m-instruct"))
    assert engine.revision == f"{weights}+ov-f32-kvf32-dq0"
    assert hf.revision == f"{weights}+float32" != engine.revision
    assert engine.device == "cpu" and engine.cacheable


def test_fast_precision_is_its_own_revision() -> None:
    fast = load_engine("ov:smollm2-135m-instruct?precision=fast", Settings.from_env())
    try:
        assert isinstance(fast, OpenVINOEngine)
        weights = file_sha256(bundled_model_path("smollm2-135m-instruct"))
        assert fast.revision.startswith(f"{weights}+ov-") and fast.revision != f"{weights}+ov-f32-kvf32-dq0"
        # the device's own defaults, whatever they are here, are what the revision records
        assert fast.precisions != {
            "INFERENCE_PRECISION_HINT": "f32",
            "KV_CACHE_PRECISION": "f32",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
        }
        (out,) = answers(fast.generate([ask("france", "What is the capital of France?", max_tokens=16)]))
        assert out.text.strip()
        print(f"\nfast revision {fast.revision}: {out.text!r}")
    finally:
        fast.close()


def test_agrees_with_the_hf_engine(engine: OpenVINOEngine, hf: HFEngine) -> None:
    requests = [ask(f"q{i}", q, max_tokens=48) for i, q in enumerate(QUESTIONS)]
    ov_out = answers(engine.generate(requests))
    hf_out = answers(hf.generate(requests))
    same = [a.text == b.text for a, b in zip(ov_out, hf_out, strict=True)]
    agreement = sum(same) / len(same)
    print(f"\nov fp32 vs hf fp32, greedy: {sum(same)}/{len(same)} identical ({agreement:.0%})")
    differing = [(a.text, b.text) for a, b, s in zip(ov_out, hf_out, same, strict=True) if not s]
    assert agreement >= AGREEMENT_FLOOR, differing
    # the same prompt tokens on both sides: same template, tokenizer and truncation
    assert [o.prompt_tokens for o in ov_out] == [o.prompt_tokens for o in hf_out]


def test_greedy_answers_do_not_depend_on_the_batch(engine: OpenVINOEngine) -> None:
    requests = [ask(f"q{i}", q, max_tokens=48) for i, q in enumerate(QUESTIONS)]
    alone = [answers(engine.generate([r]))[0].text for r in requests]
    together = [o.text for o in answers(engine.generate(requests))]
    evens = [o.text for o in answers(engine.generate(requests[::2][::-1]))][::-1]
    odds = [o.text for o in answers(engine.generate(requests[1::2]))]
    shuffled = [text for pair in zip(evens, odds, strict=True) for text in pair]
    same = sum(a == b == c for a, b, c in zip(alone, together, shuffled, strict=True))
    print(f"\nbatch invariance: {same}/{len(requests)} identical")
    differing = [(a, b, c) for a, b, c in zip(alone, together, shuffled, strict=True) if not a == b == c]
    assert same == len(requests), differing


def test_stop_strings_per_row_limits_and_sampling_in_one_call(engine: OpenVINOEngine) -> None:
    requests = [
        ask("short", "Write a long story about a dragon.", max_tokens=5),
        ask("stop", "Count from 1 to 20, one number per line.", max_tokens=64, stop=["5"]),
        ask("long", "Write a long story about a dragon.", max_tokens=40),
        ask("sampled", "Write a poem about the sea.", max_tokens=12, temperature=0.8, seed=3),
        ask("bad", "Hi", max_tokens=0),
    ]
    first = engine.generate(requests)
    short, stop, long, sampled = answers(first[:4])
    assert short.completion_tokens == 5 and short.extra["finish_reason"] == "length"
    assert long.completion_tokens == 40 and long.text.startswith(short.text)
    assert "5" not in stop.text and "4" in stop.text and stop.extra["finish_reason"] == "stop"
    assert sampled.text and sampled.completion_tokens <= 12
    assert not first[4].transient and "max_tokens" in str(first[4])  # type: ignore[union-attr]
    again = engine.generate(requests[3:4])[0]
    assert isinstance(again, GenOutput) and again.text == sampled.text  # same seed, same answer


def test_a_too_long_prompt_is_truncated_and_still_answered(
    engine: OpenVINOEngine, hf: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "context_window", 512)
    monkeypatch.setattr(hf, "context_window", 512)
    filler = "The quick brown fox jumps over the lazy dog. " * 300
    request = ask("long", filler + "\nWhat is the capital of France?", max_tokens=24)
    (out,) = answers(engine.generate([request]))
    assert out.truncated and out.prompt_tokens == 512 - 24
    assert int(out.extra["original_prompt_tokens"]) > 3000
    assert out.text.strip()
    (reference,) = answers(hf.generate([request]))
    assert (reference.prompt_tokens, reference.text) == (out.prompt_tokens, out.text)


def test_a_request_out_of_memory_fails_transiently_alone(
    engine: OpenVINOEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure of one request is that request's, transient (another worker may have the
    memory), and the others of the call are answered."""
    calls: list[int] = []
    real = engine._run

    def run_or_oom(batch: Sequence[object]) -> list[object]:
        calls.append(len(batch))
        if any(getattr(p, "index", None) == 1 for p in batch):
            raise RuntimeError("Exception from src/inference: std::bad_alloc (out of memory)")
        return list(real(batch))  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_run", run_or_oom)
    outs = engine.generate([ask(f"q{i}", q, max_tokens=8) for i, q in enumerate(QUESTIONS[:3])])
    assert isinstance(outs[0], GenOutput) and isinstance(outs[2], GenOutput)
    assert not isinstance(outs[1], GenOutput) and outs[1].transient and "out of memory" in str(outs[1])
    assert calls[0] == 3 and 1 in calls  # halved down to the failing request alone
