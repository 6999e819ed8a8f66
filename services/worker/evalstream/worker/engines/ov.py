"""`ov:<model dir | file.gguf | bundled name>[?precision=fp32|fast]`: the hf engine's weights on
OpenVINO GenAI's continuous-batching pipeline (CPU).

Where the hf engine pads a static batch and runs it until its longest answer ends, this
engine hands every request of a call to OpenVINO's scheduler, which admits new sequences as
others finish, splits long prompts into chunks shared with running decodes, and reuses the
KV cache of prompt prefixes it has seen (every chat prompt starts with the same system turn).

Faithful by default (`precision=fp32`): the IR holds the hf engine's fp32 weights bit for bit
(ov_convert.py), inference and KV cache run in fp32 and dynamic quantisation is off, so
greedy answers match the hf engine's (tests/model/test_ov_engine.py measures how many).
`precision=fast` takes the device's defaults (bf16 compute on CPUs that have it, 8-bit KV
cache, dynamic quantisation): faster, and some answers change. The revision names engine and
resolved precisions, so the answer cache never mixes answers of different precisions.

Prompts are rendered, tokenised, truncated and decoded as by the hf engine's transformers
tokenizer (same prompt text, cache key and token ids): by `tokenizers` and the chat template
alone where that is exactly transformers' reading (engines/tokenizer.py), so that this engine
loads without importing transformers and torch; the pipeline gets token ids.
Stop strings are checked by the pipeline (its converted detokenizer, to stop early) and again
on the decoded text, with the hf engine's rule: the answer ends before the earliest stop.

Log-likelihood scoring needs logits, which the pipeline does not give: it runs on the same IR
compiled by openvino.Core with the same precision properties (compiled on the first scoring
call), fed the hf engine's right-padded rows (the tokenisation, windows and passes are the
shared TokenizerEngine's), its state reset before each pass.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalstream.common.messages import GenerationParams
from evalstream.worker.batching import ScorePass
from evalstream.worker.engines.base import (
    EngineError,
    GenOutput,
    PermanentEngineError,
    TransientEngineError,
)
from evalstream.worker.engines.loglikelihood import ScoreRow, sum_logprobs
from evalstream.worker.engines.ov_convert import IR_XML, ensure_openvino_ir
from evalstream.worker.engines.shared_context import TailInputs, right_padded
from evalstream.worker.engines.tokenizer import load_tokenizer
from evalstream.worker.engines.tokenizer_engine import PreparedRequest, TokenizerEngine, split_on_oom
from evalstream.worker.engines.weights import resolve_weights

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

DEVICE = "CPU"  # OpenVINO's device; its GPU plugin is Intel's, not CUDA (vLLM is for those)
# the faithful mode: nothing rounded anywhere between the fp32 weights and the logits
FP32_PROPERTIES = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
}
_OOM_WORDS = ("out of memory", "bad_alloc", "cannot allocate", "failed to allocate")


@dataclass(frozen=True)
class SchedulerLimits:
    """OpenVINO's scheduler: tokens per step (prompt chunks + one per running decode),
    sequences at once, and the KV cache's size. Defaults in WorkerSettings (measured)."""

    max_batched_tokens: int
    max_sequences: int
    kv_cache_gb: float


def precision_properties(precision: str) -> dict[str, str]:
    """OpenVINO compile properties of a precision mode: fp32 pins every precision; fast
    leaves the device's defaults."""
    if precision == "fp32":
        return dict(FP32_PROPERTIES)
    if precision == "fast":
        return {}
    raise PermanentEngineError(f"unknown ov: precision {precision!r} (fp32 or fast)")


def resolved_precisions(core: Any, properties: dict[str, str]) -> dict[str, str]:
    """What the device will actually use: the properties asked for, else its defaults."""
    out = {}
    for key in FP32_PROPERTIES:
        value = properties.get(key)
        out[key] = str(value if value is not None else _type_name(core.get_property(DEVICE, key)))
    return out


def _type_name(value: Any) -> str:
    get = getattr(value, "get_type_name", None)
    return str(get()) if callable(get) else str(value)


def revision_of(weights_id: str, precisions: dict[str, str]) -> str:
    """e.g. <weights>+ov-f32-kvf32-dq0 (faithful) or <weights>+ov-bf16-kvu8-dq32 (fast on
    an AVX512-BF16 CPU): the engine and every precision that changes answers."""
    return (
        f"{weights_id}+ov-{precisions['INFERENCE_PRECISION_HINT']}"
        f"-kv{precisions['KV_CACHE_PRECISION']}-dq{precisions['DYNAMIC_QUANTIZATION_GROUP_SIZE']}"
    )


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _OOM_WORDS)


class OpenVINOEngine(TokenizerEngine):
    """A continuous-batching OpenVINO GenAI pipeline on the CPU."""

    def __init__(
        self,
        source: str | Path,
        *,
        limits: SchedulerLimits,
        name: str | None = None,
        cache_dir: str | Path | None = None,
        precision: str = "fp32",
        context_window: int | None = None,
    ) -> None:
        import openvino
        import openvino_genai

        started = time.perf_counter()
        source = Path(source).expanduser()
        self.name = name or f"ov:{source}"
        self.precision = precision
        # contexts are shared through a copy of the key/value state, which numpy holds in
        # fp32 (the fast mode may keep it in a type numpy has not)
        self.shares_contexts = precision == "fp32"
        model_dir, weights_id = resolve_weights(source, cache_dir)
        ir_root = Path(cache_dir).expanduser() if cache_dir is not None else model_dir.parent
        self.ir_dir = ensure_openvino_ir(model_dir, weights_id, ir_root)
        properties = precision_properties(precision)
        core = openvino.Core()
        self.precisions = resolved_precisions(core, properties)
        self.revision = revision_of(weights_id, self.precisions)
        self.cacheable = True
        self.device = "cpu"
        self.limits = limits
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = True  # every chat prompt starts with the same system turn
        scheduler.dynamic_split_fuse = True  # long prompts in chunks, beside running decodes
        scheduler.max_num_batched_tokens = limits.max_batched_tokens
        scheduler.max_num_seqs = limits.max_sequences
        scheduler.cache_size = max(1, round(limits.kv_cache_gb))  # GB
        compile_properties: dict[str, Any] = {
            key: _ov_value(openvino, key, value) for key, value in properties.items()
        }
        compile_properties["INFERENCE_NUM_THREADS"] = _cores()
        self._compile_properties = compile_properties
        self._core = core
        self._scorer: Any = None  # the IR compiled for logits, on the first scoring call
        with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as beside:
            # read beside the compile, which releases the GIL (seconds of a worker's start);
            # without transformers (and torch) where that is exact (engines/tokenizer.py)
            tokenizer = beside.submit(load_tokenizer, model_dir)
            self.pipeline = openvino_genai.ContinuousBatchingPipeline(
                str(self.ir_dir), scheduler, DEVICE, compile_properties
            )
            self.tokenizer = tokenizer.result()
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.context_window = context_window or _context_window(model_dir)
        eos = self.pipeline.get_config().eos_token_id
        eos_ids = {eos, self.tokenizer.eos_token_id, *_generation_eos(model_dir)}
        self._eos_ids = sorted(i for i in eos_ids if isinstance(i, int) and i >= 0)
        self._end_ids = {*self._eos_ids, self.tokenizer.pad_token_id}
        self._lock = threading.Lock()  # one generate() at a time; the scheduler batches inside
        self.load_seconds = time.perf_counter() - started
        log.info(
            "loaded %s on OpenVINO %s in %.1f s (revision %s, scheduler %s)",
            self.name,
            DEVICE,
            self.load_seconds,
            self.revision,
            limits,
        )

    # -- Engine protocol --

    def _generate_group(self, group: list[PreparedRequest]) -> Sequence[GenOutput | EngineError]:
        return split_on_oom(group, self._run, is_oom)

    def close(self) -> None:
        self.pipeline = None
        self._scorer = None

    def _score_pass(self, score_pass: ScorePass, rows: Sequence[ScoreRow]) -> list[tuple[float, bool]]:
        """One pass of the IR compiled for scoring: right-padded rows, position ids from 0, the
        attention mask all ones (a row's tokens never see the padding after them, as in the
        hf engine's pass without a mask), the KV state reset first; the logits of each row's
        last `keep` positions only."""
        import numpy as np
        import torch

        input_ids = right_padded([r.ids for r in rows], score_pass.width, self.pad_id)
        keep = score_pass.keep
        positions = np.maximum(
            np.asarray([len(r.ids) - keep for r in rows], dtype=np.int64)[:, None] + np.arange(keep), 0
        )
        logits = self._infer_from_start(input_ids, positions)
        kept = np.concatenate([logits[row, keep - len(r.targets) :] for row, r in enumerate(rows)])
        return sum_logprobs(torch.from_numpy(kept), [r.targets for r in rows])

    def _context_pass(self, input_ids: np.ndarray, lengths: Sequence[int]) -> tuple[Any, list[Any]]:
        """shared_context's context pass: the logits of each row's last token (the only ones
        computed) and a copy of the key/value state."""
        import numpy as np
        import torch

        last = np.asarray([[n - 1] for n in lengths], dtype=np.int64)
        first = self._infer_from_start(input_ids, last)[:, 0].copy()
        state = [torch.from_numpy(s.state.data.copy()) for s in self._score_request().query_state()]
        return torch.from_numpy(first), state

    def _infer_from_start(self, input_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The scoring request run on right-padded rows from an empty state: the logits at
        `positions` (rows x kept), a view of the request's output."""
        import numpy as np

        request = self._score_request()
        request.reset_state()
        request.infer(
            {
                "input_ids": input_ids,
                "attention_mask": np.ones_like(input_ids),
                "position_ids": np.broadcast_to(
                    np.arange(input_ids.shape[1], dtype=np.int64), input_ids.shape
                ).copy(),
                "beam_idx": np.arange(len(input_ids), dtype=np.int32),
                KEEP_INPUT: positions,
            }
        )
        return request.get_tensor("logits").data

    def _tail_pass(self, state: list[Any], inputs: TailInputs) -> Any:
        """The state set to the rows' contexts (the IR keeps it inside the request)."""
        import numpy as np
        import openvino
        import torch

        request = self._score_request()
        for variable, part in zip(request.query_state(), state, strict=True):
            variable.state = openvino.Tensor(np.ascontiguousarray(part.numpy()))
        rows, width = inputs.input_ids.shape
        request.infer(
            {
                "input_ids": inputs.input_ids,
                "attention_mask": inputs.attention_mask,
                "position_ids": inputs.position_ids,
                "beam_idx": np.arange(len(inputs.input_ids), dtype=np.int32),
                KEEP_INPUT: np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width)).copy(),
            }
        )
        return torch.from_numpy(request.get_tensor("logits").data.copy())

    def _score_request(self) -> Any:
        if self._scorer is None:
            started = time.perf_counter()
            model = keep_only_positions(self._core.read_model(str(self.ir_dir / IR_XML)))
            compiled = self._core.compile_model(model, DEVICE, self._compile_properties)
            self._scorer = compiled.create_infer_request()
            log.info("compiled %s for scoring in %.1f s", self.name, time.perf_counter() - started)
        return self._scorer

    def _is_oom(self, exc: BaseException) -> bool:
        return is_oom(exc)

    # -- internals --

    def _config(self, params: GenerationParams) -> Any:
        import openvino_genai

        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = params.max_tokens
        config.stop_token_ids = set(self._eos_ids)
        stops = {s for s in params.stop if s}
        if stops:
            config.stop_strings = stops
            config.include_stop_str_in_output = True  # cut below, by the hf engine's rule
        if params.temperature > 0:
            config.do_sample = True
            config.temperature = params.temperature
            config.top_p = params.top_p
            config.rng_seed = params.seed
        else:
            config.do_sample = False
        return config

    def _run(self, batch: Sequence[PreparedRequest]) -> list[GenOutput | EngineError]:
        import numpy as np
        import openvino

        if self.pipeline is None:
            raise RuntimeError("engine closed")
        started = time.perf_counter()
        inputs = [openvino.Tensor(np.asarray([p.ids], dtype=np.int64)) for p in batch]
        outs = self.pipeline.generate(inputs, [self._config(p.params) for p in batch])
        latency_ms = (time.perf_counter() - started) * 1000
        if len(outs) != len(batch):
            raise RuntimeError(f"OpenVINO returned {len(outs)} results for {len(batch)} requests")
        results: list[GenOutput | EngineError] = []
        for p, out in zip(batch, outs, strict=True):
            generated = list(out.m_generation_ids[0]) if out.m_generation_ids else None
            if generated is None:
                # the scheduler could not place it (a prompt larger than the KV cache):
                # another worker, or a later attempt, may have the room
                results.append(
                    TransientEngineError("OpenVINO's scheduler dropped the request (KV cache full)")
                )
                continue
            results.append(self._output(p, generated, latency_ms))
        return results


KEEP_INPUT = "logits_positions"  # the scoring IR's extra input: rows x kept positions


def keep_only_positions(model: Any) -> Any:
    """The IR with the language-model head applied to the hidden states at the positions of a
    new input (rows x kept) only, as transformers' logits_to_keep: the head (576 x 49,152 for
    SmolLM2-135M) costs a quarter of the body per position, and scoring needs few positions."""
    import openvino
    from openvino import opset13

    [result] = model.get_results()
    head = result.input_value(0).get_node()
    if head.get_type_name() != "MatMul":
        raise PermanentEngineError(
            f"the IR's logits come from a {head.get_type_name()}, not the head's MatMul"
        )
    positions = opset13.parameter([-1, -1], openvino.Type.i64, name=KEEP_INPUT)
    positions.output(0).get_tensor().set_names({KEEP_INPUT})
    hidden = head.input_value(0)
    picked = opset13.gather(hidden, positions, axis=1, batch_dims=1)
    head.input(0).replace_source_output(picked.output(0))
    model.add_parameters([positions])
    model.validate_nodes_and_infer_types()
    return model


def _ov_value(openvino: Any, key: str, value: str) -> Any:
    if key == "DYNAMIC_QUANTIZATION_GROUP_SIZE":
        return int(value)
    return openvino.Type.f32 if value == "f32" else value


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use, not the host's
    except AttributeError:
        return os.cpu_count() or 1


def _context_window(model_dir: Path) -> int:
    import json

    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("max_position_embeddings") or 2048)


def _generation_eos(model_dir: Path) -> list[int]:
    import json

    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return list(eos) if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
