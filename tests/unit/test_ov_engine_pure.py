"""The `ov:` engine's parts that need no model: its SPEC, allow-list, precision modes and
revision naming, and the worker's batch limits per engine and device (issue 17)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evalstream.common.settings import BATCH_LIMITS, DEFAULTS, Settings, WorkerSettings
from evalstream.common.specs import SpecError, parse_model_spec, serves
from evalstream.worker.engines import PermanentEngineError, validate_spec
from evalstream.worker.engines.ov import FP32_PROPERTIES, precision_properties, revision_of


@pytest.mark.parametrize(
    ("spec", "target", "precision"),
    [
        ("ov:smollm2-135m-instruct", "smollm2-135m-instruct", "fp32"),
        ("ov:smollm2-135m-instruct?precision=fp32", "smollm2-135m-instruct", "fp32"),
        ("ov:smollm2-135m-instruct?precision=fast", "smollm2-135m-instruct", "fast"),
        ("ov:/models/llama", "/models/llama", "fp32"),
        ("ov:./model.gguf?precision=fast", "./model.gguf", "fast"),
    ],
)
def test_ov_specs_parse_with_their_precision(spec: str, target: str, precision: str) -> None:
    parsed = parse_model_spec(spec)
    assert (parsed.scheme, parsed.target, parsed.precision) == ("ov", target, precision)
    assert parsed.identity == f"ov:{target}"  # the option never helps a SPEC match an allow-list
    assert parse_model_spec("hf:smollm2-135m-instruct").precision == ""


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("ov:", "nothing after"),
        ("ov:?precision=fast", "names no model"),
        ("ov:not-a-bundled-model", "neither a path nor a bundled model"),
        ("ov:../../etc/model", "'..' in a path"),
        ("ov:smollm2-135m-instruct?precision=int4", "precision must be one of fp32, fast"),
        ("ov:smollm2-135m-instruct?device=GPU", "unknown option 'device'"),
        ("ov:smollm2-135m-instruct?key_env=DATABASE_URL", "unknown option"),
    ],
)
def test_bad_ov_specs_are_refused_at_intake(spec: str, fragment: str) -> None:
    with pytest.raises(SpecError, match="model SPEC") as info:
        parse_model_spec(spec)
    assert fragment in str(info.value)
    assert fragment in (validate_spec(spec) or "")


def test_allow_list_covers_ov_by_default_and_only_when_listed() -> None:
    default = WorkerSettings().worker_model
    assert serves(default, "ov:smollm2-135m-instruct")
    assert serves(default, "ov:smollm2-135m-instruct?precision=fast")
    assert not serves(default, "ov:/models/other")
    assert not serves("hf:smollm2-135m-instruct,null", "ov:smollm2-135m-instruct")
    assert serves("ov:*", "ov:/models/other?precision=fast")
    assert DEFAULTS["WORKER_MODEL"] == (
        "smollm2-135m-instruct,hf:smollm2-135m-instruct,ov:smollm2-135m-instruct,null,replay:*"
    )


def test_fp32_pins_every_precision_and_fast_takes_the_devices() -> None:
    assert precision_properties("fp32") == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
    }
    assert precision_properties("fast") == {}
    with pytest.raises(PermanentEngineError, match="fp32 or fast"):
        precision_properties("int4")


def test_revision_names_engine_and_every_precision() -> None:
    faithful = revision_of("abc", dict(FP32_PROPERTIES))
    fast = revision_of(
        "abc",
        {
            "INFERENCE_PRECISION_HINT": "bf16",
            "KV_CACHE_PRECISION": "u8",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": "32",
        },
    )
    assert faithful == "abc+ov-f32-kvf32-dq0"
    assert fast == "abc+ov-bf16-kvu8-dq32"
    # the hf engine's revision on the same weights is "<weights>+float32": never the same key
    assert faithful != "abc+float32" and faithful != fast


def test_batch_limits_per_engine_and_device_unless_overridden() -> None:
    s = Settings()
    assert s.batch_limits("hf:smollm2-135m-instruct", "cpu") == BATCH_LIMITS[("hf", "cpu")]
    assert s.batch_limits("hf:smollm2-135m-instruct", "cuda:0 (NVIDIA H200)") == BATCH_LIMITS[("hf", "cuda")]
    assert s.batch_limits("ov:smollm2-135m-instruct?precision=fast", "cpu") == BATCH_LIMITS[("ov", "cpu")]
    # engines without limits of their own (null, replay) get the hf figure of their device
    assert s.batch_limits("null", "cpu") == BATCH_LIMITS[("hf", "cpu")]
    # the GPU figure stays the seed's; the CPU ones are measured and larger
    assert BATCH_LIMITS[("hf", "cuda")] == (2048, 64)
    assert BATCH_LIMITS[("hf", "cpu")][0] > 2048 and BATCH_LIMITS[("ov", "cpu")][0] > 2048
    forced = Settings.from_env({"BATCH_TOKEN_BUDGET": "4096", "BATCH_MAX_ITEMS": "8"})
    assert forced.batch_limits("ov:smollm2-135m-instruct", "cpu") == (4096, 8)
    only_items = Settings.from_env({"BATCH_MAX_ITEMS": "8"})
    assert only_items.batch_limits("hf:smollm2-135m-instruct", "cpu") == (BATCH_LIMITS[("hf", "cpu")][0], 8)


def test_importing_the_ov_engine_module_loads_no_openvino_or_torch() -> None:
    code = (
        "import sys; import evalstream.worker.engines.ov, evalstream.worker.engines.ov_convert; "
        "print(sorted({'torch', 'transformers', 'openvino', 'openvino_genai'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
