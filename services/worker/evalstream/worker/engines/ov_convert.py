"""The `ov:` engine's model files: the hf engine's fp32 weights as an OpenVINO IR.

The source is the folder the hf engine loads (a transformers folder, or the safetensors copy
of a GGUF file that weights.py caches), so that both engines compute with the very same numbers.
OpenVINO's own converter (`openvino.convert_model`) traces the transformers model with
explicit key/value inputs; the graph is then made stateful (the KV cache as model state, a
`beam_idx` input) the way OpenVINO GenAI's continuous-batching pipeline expects, which it
rewrites into paged attention when it loads the model. No F16 compression: the IR is saved
with `compress_to_fp16=False`, and every weight of the source is checked to be in the IR
bit for bit before the IR is used (`weights_exact`).

Converted once per source weights, converter versions and conversion format, into
MODEL_CACHE_DIR/ov-<key>/ (a temporary folder renamed into place, as weights.py does), with the
tokenizer converted by openvino-tokenizers (the pipeline needs it for stop strings) and the
source's config and tokenizer files. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from evalstream.worker.engines import EngineConfigError

log = logging.getLogger(__name__)

IR_MARKER = "evalstream-ir.json"  # written last: a folder without it is incomplete
IR_XML = "openvino_model.xml"
# bump when the conversion below changes what it writes: old IRs are then not reused
CONVERSION_FORMAT = 1
# copied next to the IR: the pipeline reads generation defaults, the tokenizer's chat template
_SOURCE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def ir_key(weights_id: str) -> str:
    """The IR cache entry of a source: its weights and everything that shapes the conversion
    (transformers' version read from its metadata: importing it would import torch, seconds
    of a worker's start that an existing IR does not need)."""
    from importlib.metadata import version

    import openvino

    parts = [weights_id, openvino.__version__, version("transformers"), str(CONVERSION_FORMAT)]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def ensure_openvino_ir(source: Path, weights_id: str, cache_dir: Path) -> Path:
    """The IR folder of the transformers model in `source`, converted if missing."""
    final = cache_dir / f"ov-{ir_key(weights_id)}"
    if (final / IR_MARKER).is_file():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache_dir))
    try:
        started = time.perf_counter()
        log.info("converting %s to an fp32 OpenVINO IR once into %s (about a minute)", source, final)
        report = convert(source, tmp)
        marker = {"source": str(source), "weights_id": weights_id, **report}
        (tmp / IR_MARKER).write_text(json.dumps(marker, indent=1))
        tmp.chmod(0o755)  # mkdtemp makes it private
        if final.exists() and not (final / IR_MARKER).is_file():
            shutil.rmtree(final, ignore_errors=True)  # debris of an interrupted conversion
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / IR_MARKER).is_file():
                raise
            log.info("another process converted %s first; using its IR", source)
        else:
            log.info("converted %s in %.1f s", source, time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def convert(source: Path, out: Path) -> dict[str, Any]:
    """Writes the stateful fp32 IR, the OpenVINO tokenizer and the source's config files."""
    import openvino
    import torch
    import transformers
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    config = model.config
    layers = int(config.num_hidden_layers)
    example = _example_inputs(config)
    with torch.inference_mode():
        ov_model = openvino.convert_model(_with_explicit_cache(model), example_input=example)
    kv_in = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    kv_out = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    for port, name in zip(
        ov_model.inputs, ["input_ids", "attention_mask", "position_ids", *kv_in], strict=True
    ):
        port.get_tensor().set_names({name})
    for port, name in zip(ov_model.outputs, ["logits", *kv_out], strict=True):
        port.get_tensor().set_names({name})
    attention = sum(1 for op in ov_model.get_ops() if op.get_type_name() == "ScaledDotProductAttention")
    if attention != layers:
        raise EngineConfigError(
            f"{config.model_type} model in {source}: {attention} attention ops for {layers} layers after "
            "conversion; the ov: engine serves decoder-only models whose attention OpenVINO recognises"
        )
    _make_stateful(ov_model, kv_in, kv_out)
    weights = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    mismatched = weights_exact(ov_model, weights)
    if mismatched:
        raise EngineConfigError(
            f"the OpenVINO IR of {source} does not hold {len(mismatched)} weights exactly "
            f"(e.g. {mismatched[:3]}); refusing an inexact conversion"
        )
    openvino.save_model(ov_model, out / IR_XML, compress_to_fp16=False)
    tokenizer = AutoTokenizer.from_pretrained(source)
    ov_tokenizer, ov_detokenizer = convert_tokenizer(tokenizer, with_detokenizer=True)
    openvino.save_model(ov_tokenizer, out / "openvino_tokenizer.xml")
    openvino.save_model(ov_detokenizer, out / "openvino_detokenizer.xml")
    for name in _SOURCE_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    return {
        "openvino": openvino.__version__,
        "transformers": transformers.__version__,
        "conversion_format": CONVERSION_FORMAT,
        "weights_checked": len(weights),
    }


def _with_explicit_cache(model: Any) -> Any:
    """The transformers model with its KV cache as plain tensors in and out, so that tracing
    sees the cache concatenation that OpenVINO turns into model state."""
    import torch
    from transformers.cache_utils import DynamicCache

    class WithExplicitCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *kv: Any) -> Any:
            cache = DynamicCache(config=model.config)
            # filled directly: DynamicCache's lazy start concatenates onto an empty tensor,
            # which the tracer would freeze into the graph
            layers: list[Any] = list(cache.layers)
            for i, layer in enumerate(layers):
                layer.keys, layer.values = kv[2 * i], kv[2 * i + 1]
                layer.is_initialized = True
                layer.device, layer.dtype = kv[0].device, kv[0].dtype
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            flat = [out.logits]
            for layer in out.past_key_values.layers:
                flat += [layer.keys, layer.values]
            return tuple(flat)

    return WithExplicitCache()


def _example_inputs(config: Any) -> tuple[Any, ...]:
    import torch

    batch, new, past = 2, 3, 4  # any sizes > 1: the traced shapes stay dynamic
    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    kv = [torch.zeros(batch, kv_heads, past, head_dim) for _ in range(2 * int(config.num_hidden_layers))]
    positions = torch.arange(past, past + new).unsqueeze(0).expand(batch, new)
    return (
        torch.ones(batch, new, dtype=torch.long),
        torch.ones(batch, past + new, dtype=torch.long),
        positions,
        *kv,
    )


def _make_stateful(ov_model: Any, kv_in: list[str], kv_out: list[str]) -> None:
    """KV inputs/outputs → model state, with a `beam_idx` gather and zero-initialised state:
    the graph shape OpenVINO GenAI's SDPAToPagedAttention expects."""
    import numpy as np
    import openvino
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    batch_dim = ov_model.input("input_ids").get_partial_shape()[0]
    beam_idx = ops.parameter(
        name="beam_idx", dtype=openvino.Type.i32, shape=openvino.PartialShape([batch_dim])
    )
    beam_idx.output(0).get_tensor().add_names({"beam_idx"})
    ov_model.add_parameters([beam_idx])
    for name in kv_in:
        port = ov_model.input(name)
        consumers = port.get_target_inputs()
        reordered = ops.gather(port, beam_idx, ops.constant(0))
        for consumer in consumers:
            consumer.replace_source_output(reordered.output(0))
    ov_model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(ov_model, dict(zip(kv_in, kv_out, strict=True)))
    ids_shape = ops.shape_of(ov_model.input("input_ids"), output_type="i64")
    batch = ops.gather(ids_shape, ops.constant([0]), ops.constant(0))
    for op in ov_model.get_ops():
        if op.get_type_name() == "ReadValue":
            dims: list[Any] = [d.min_length for d in op.get_output_partial_shape(0)]
            dims[0] = batch
            parts = [ops.constant(np.array([d], dtype=np.int64)) if isinstance(d, int) else d for d in dims]
            zero = ops.constant(0.0, dtype=op.get_output_element_type(0))
            op.set_arguments([ops.broadcast(zero, ops.concat(parts, axis=0))])
    ov_model.validate_nodes_and_infer_types()


def _digest(array: Any) -> str:
    import numpy as np

    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).hexdigest()


def ir_constants(ov_model: Any) -> Iterable[tuple[str, Any]]:
    """(element type, data) of every constant of the IR (data as numpy arrays)."""
    for op in ov_model.get_ops():
        if op.get_type_name() == "Constant":
            yield op.get_output_element_type(0).get_type_name(), op.get_data()


def weights_exact(ov_model: Any, weights: Mapping[str, Any]) -> list[str]:
    """Names of the source weights not found bit for bit among the IR's fp32 constants (as
    stored, transposed, or reshaped for broadcasting, as norm weights are); empty when the IR
    holds every weight exactly."""
    found: set[tuple[int, str]] = set()
    for kind, data in ir_constants(ov_model):
        if kind == "f32" and data.size > 1:
            found.add((data.size, _digest(data)))
    missing = []
    for name, array in weights.items():
        candidates = [array] + ([array.T] if array.ndim == 2 else [])
        if not any((c.size, _digest(c)) in found for c in candidates):
            missing.append(name)
    return missing
