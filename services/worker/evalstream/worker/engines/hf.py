"""`hf:<model dir | file.gguf | bundled name>`: the local torch engine.

The weights are resolved by weights.py (a GGUF file de-quantised into a safetensors cache
once); prompts, tokenising, grouping and lm-eval's scoring rows are TokenizerEngine's
(tokenizer_engine.py, loglikelihood.py). Generation is batched with left padding; greedy
answers do not depend on what else is in the batch (tests/model/test_hf_engine.py measures it).

torch and transformers are imported lazily so that importing this package stays cheap.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from evalstream.common.messages import GenerationParams
from evalstream.worker.batching import ScorePass
from evalstream.worker.engines.base import EngineError, GenOutput
from evalstream.worker.engines.loglikelihood import ScoreRow, sum_logprobs
from evalstream.worker.engines.shared_context import TailInputs
from evalstream.worker.engines.tokenizer_engine import (
    SCORE_PASS_LIMITS,
    PreparedRequest,
    TokenizerEngine,
    split_on_oom,
    torch_oom,
)
from evalstream.worker.engines.weights import ensure_safetensors_cache, file_sha256, resolve_weights

if TYPE_CHECKING:
    import numpy as np
    import torch

# bench/ imports the weights cache from here, where it lived before weights.py
__all__ = ["HFEngine", "ensure_safetensors_cache", "file_sha256"]

log = logging.getLogger(__name__)


class HFEngine(TokenizerEngine):
    """transformers model on CUDA (bf16) when available, else on the CPU (fp32)."""

    def __init__(
        self,
        source: str | Path,
        *,
        name: str | None = None,
        cache_dir: str | Path | None = None,
        device: str | None = None,
        context_window: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # per-tensor progress bars flood the worker's log
        started = time.perf_counter()
        source = Path(source).expanduser()
        self.name = name or f"hf:{source}"
        self.model_dir, weights_id = resolve_weights(source, cache_dir)

        self._device, dtype, self.device = _pick_device(device)
        self.score_pass_tokens, self.score_max_rows = SCORE_PASS_LIMITS[
            "cuda" if self._device.type == "cuda" else "cpu"
        ]
        # the precision changes answers, so it is part of the revision (the cache key)
        self.cacheable = True
        self.revision = f"{weights_id}+{str(dtype).removeprefix('torch.')}"
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # Any: transformers' annotations of from_pretrained/to are too loose to help here
        self.model: Any = cast(Any, AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype))
        self.model.to(self._device).eval()
        self.context_window = context_window or int(
            getattr(self.model.config, "max_position_embeddings", 2048)
        )
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        eos_ids.add(self.tokenizer.eos_token_id)
        self._eos_ids = sorted(i for i in eos_ids if i is not None)
        self._end_ids = {*self._eos_ids, self.tokenizer.pad_token_id}
        self._lock = threading.Lock()  # one generate() at a time: the model is not reentrant
        self.shares_contexts = _plain_key_value_cache(self.model.config)
        self.load_seconds = time.perf_counter() - started
        log.info(
            "loaded %s on %s in %.1f s (revision %s)",
            self.name,
            self.device,
            self.load_seconds,
            self.revision,
        )

    # -- Engine protocol --

    def _generate_group(self, group: list[PreparedRequest]) -> Sequence[GenOutput | EngineError]:
        return split_on_oom(group, self._run_batch, torch_oom, self._free_memory)

    def close(self) -> None:
        self.model = None
        gc.collect()
        self._free_memory()

    # -- internals --

    def _run_batch(self, batch: Sequence[PreparedRequest]) -> list[GenOutput]:
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        started = time.perf_counter()
        width = max(len(p.ids) for p in batch)
        pad = int(self.tokenizer.pad_token_id)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, p in enumerate(batch):  # left padding: every row's last token is aligned
            input_ids[row, width - len(p.ids) :] = torch.tensor(p.ids)
            attention_mask[row, width - len(p.ids) :] = 1
        params = batch[0].params
        config = GenerationConfig(
            max_new_tokens=max(p.params.max_tokens for p in batch),
            pad_token_id=pad,
            eos_token_id=self._eos_ids,
            num_beams=1,
            **(
                {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
                if params.temperature > 0
                else {"do_sample": False}
            ),
        )
        stopper = _RowStop(width, [p.params for p in batch], self.tokenizer)
        if params.temperature > 0:
            torch.manual_seed(params.seed)  # sampled answers repeat for the same batch
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self._device),
                attention_mask=attention_mask.to(self._device),
                generation_config=config,
                stopping_criteria=StoppingCriteriaList([stopper]),
            )
        latency_ms = (time.perf_counter() - started) * 1000
        return [self._output(p, out[row, width:].tolist(), latency_ms) for row, p in enumerate(batch)]

    def _score_pass(self, score_pass: ScorePass, rows: Sequence[ScoreRow]) -> list[tuple[float, bool]]:
        """One right-padded pass without an attention mask (lm-eval's way), keeping the
        logits of each row's last `keep` positions only (logits_to_keep as positions)."""
        import torch

        width, keep = score_pass.width, score_pass.keep
        input_ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
        positions = torch.zeros((len(rows), keep), dtype=torch.long)
        for row, r in enumerate(rows):
            input_ids[row, : len(r.ids)] = torch.tensor(r.ids)
            # the row's last `keep` positions (repeating position 0 where the row is shorter)
            positions[row] = (torch.arange(keep) + (len(r.ids) - keep)).clamp(min=0)
        with torch.inference_mode():
            logits = self.model(
                input_ids=input_ids.to(self._device),
                logits_to_keep=positions.to(self._device),
                use_cache=False,
            ).logits
            kept = torch.cat([logits[row, keep - len(r.targets) :] for row, r in enumerate(rows)])
        return sum_logprobs(kept, [r.targets for r in rows])

    def _context_pass(self, input_ids: np.ndarray, lengths: Sequence[int]) -> tuple[Any, list[Any]]:
        """shared_context's context pass: the logits of each row's last token (the only ones
        computed) and the key/value cache."""
        import torch
        from transformers import DynamicCache

        last = torch.tensor([[n - 1] for n in lengths], dtype=torch.long)
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            logits = self.model(
                input_ids=torch.from_numpy(input_ids).to(self._device),
                logits_to_keep=last.to(self._device),
                cache=cache,
                use_cache=True,
            ).logits
        layers: list[Any] = list(cache.layers)  # full-attention layers: keys and values
        return logits[:, 0], [t for layer in layers for t in (layer.keys, layer.values)]

    def _tail_pass(self, state: list[Any], inputs: TailInputs) -> Any:
        import torch
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer in range(len(state) // 2):
            cache.update(state[2 * layer], state[2 * layer + 1], layer)
        with torch.inference_mode():
            return self.model(
                input_ids=torch.from_numpy(inputs.input_ids).to(self._device),
                attention_mask=torch.from_numpy(inputs.attention_mask).to(self._device),
                position_ids=torch.from_numpy(inputs.position_ids).to(self._device),
                cache=cache,
                use_cache=True,
            ).logits

    def _free_memory(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _RowStop:
    """Stops each row at its own max_tokens or stop string, so that one long answer does not
    keep generating for rows that are done (transformers pads finished rows)."""

    def __init__(self, prompt_width: int, params: list[GenerationParams], tokenizer: Any) -> None:
        self.prompt_width = prompt_width
        self.max_tokens = [p.max_tokens for p in params]
        self.stops = [[s for s in p.stop if s] for p in params]
        self.tokenizer = tokenizer
        # a token decodes to at least one character (or part of one): this many tokens cover
        # the longest stop string
        self.window = max((len(s) for row in self.stops for s in row), default=0) + 4

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        import torch

        produced = input_ids.shape[1] - self.prompt_width
        done = [produced >= m for m in self.max_tokens]
        for row, stops in enumerate(self.stops):
            if stops and not done[row]:
                tail = self.tokenizer.decode(
                    input_ids[row, -min(produced, self.window) :], skip_special_tokens=True
                )
                done[row] = any(s in tail for s in stops)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _plain_key_value_cache(config: Any) -> bool:
    """Whether every layer keeps plain keys and values (full attention), which a context's
    state shared between continuations needs (shared_context.py); sliding windows and
    recurrent layers score whole rows."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _pick_device(requested: str | None) -> tuple[torch.device, torch.dtype, str]:
    """(torch device, dtype, label for heartbeats): CUDA in bf16 when present, else CPU fp32."""
    import torch

    if requested is None:
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(requested)
    if device.type == "cuda":
        index = device.index or 0
        bf16 = torch.cuda.is_bf16_supported()
        label = f"cuda:{index} ({torch.cuda.get_device_name(index)})"
        return torch.device("cuda", index), torch.bfloat16 if bf16 else torch.float16, label
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use, not the host's
    except AttributeError:
        cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    return device, torch.float32, "cpu"
