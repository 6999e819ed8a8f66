"""`hf:<model dir | file.gguf | bundled name>`: the local torch engine.

A GGUF file is de-quantised by transformers once (~20 s for SmolLM2-135M on two CPU cores)
and cached as safetensors under MODEL_CACHE_DIR/<sha256[:16]>/ with its tokenizer; later
starts load that folder (~2 s). Generation is batched with left padding; greedy answers do
not depend on what else is in the batch (tests/model/test_hf_engine.py measures it).

torch and transformers are imported lazily so that importing this package stays cheap.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.worker.batching import ScorePass, plan_score_passes
from evalstream.worker.engines import EngineConfigError
from evalstream.worker.engines.base import (
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    TransientEngineError,
    plain_prompt,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

CACHE_MARKER = "evalstream-cache.json"  # written last: a folder without it is incomplete
# files that determine a model folder's answers (README and the like do not)
_MODEL_FILE_SUFFIXES = {".safetensors", ".bin", ".json", ".model", ".jinja", ".txt"}

T = TypeVar("T")
R = TypeVar("R")


# ---- weights identity and the safetensors cache ------------------------------------------


def file_sha256(path: Path) -> str:
    # measured: 0.06 s for the 98 MB SmolLM2 GGUF (page cache warm), so no memo is needed
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def model_dir_fingerprint(path: Path) -> str:
    """Cheap but stable identity of a model folder: names, sizes and first MiB of the files
    that matter. Hashing gigabytes of weights at every start would not be cheap."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES):
        h.update(f"{f.name}\x00{f.stat().st_size}\x00".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def ensure_safetensors_cache(gguf: Path, cache_dir: Path, digest: str) -> Path:
    """The de-quantised copy of `gguf` (model + tokenizer as safetensors), built if missing.

    Built in a temporary folder and renamed into place, so that two workers starting at
    once never see a half-written cache: the loser of the rename uses the winner's copy."""
    final = cache_dir / digest[:16]
    if (final / CACHE_MARKER).is_file():
        return final
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=cache_dir))
    try:
        started = time.perf_counter()
        log.info("de-quantising %s once into %s (tens of seconds; later starts take ~2 s)", gguf.name, final)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # transformers refuses to serialise a GGUF-loaded model although its weights are
        # plain fp32 by now; without the quantizer and its config it saves normally
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        marker = {"gguf": str(gguf), "sha256": digest, "transformers": transformers.__version__}
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=1))
        tmp.chmod(0o755)  # mkdtemp makes it private
        if final.exists() and not (final / CACHE_MARKER).is_file():
            shutil.rmtree(final, ignore_errors=True)  # debris of something that was not us
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / CACHE_MARKER).is_file():
                raise
            log.info("another process cached %s first; using its copy", gguf.name)
        else:
            log.info(
                "cached %s as safetensors in %s (%.1f s)", gguf.name, final, time.perf_counter() - started
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_weights(source: Path, cache_dir: str | Path | None) -> tuple[Path, str]:
    """(transformers model folder, weights identity) of an `hf:`/`ov:` source: a GGUF file's
    de-quantised safetensors copy (built once), or a model folder as it is."""
    if source.suffix == ".gguf":
        if cache_dir is None:
            raise EngineConfigError("a GGUF model needs a cache folder (MODEL_CACHE_DIR)")
        weights_id = file_sha256(source)
        return ensure_safetensors_cache(source, Path(cache_dir).expanduser(), weights_id), weights_id
    if (source / "config.json").is_file():
        return source, model_dir_fingerprint(source)
    raise EngineConfigError(f"not a .gguf file nor a transformers model folder: {source}")


# ---- pure helpers (unit-tested without a model) -------------------------------------------


def truncate_middle(ids: list[int], limit: int) -> list[int]:
    """Keeps the head (system prompt, start of the question) and the tail (the question's
    end and the assistant header the answer must follow) of a too long prompt."""
    if len(ids) <= limit:
        return ids
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head) :]


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def split_on_oom(
    items: Sequence[T],
    run: Callable[[Sequence[T]], list[R]],
    is_oom: Callable[[BaseException], bool],
    on_oom: Callable[[], None] | None = None,
) -> list[R | EngineError]:
    """run(items); on out-of-memory, run each half separately, down to single items, which
    then fail transiently (another worker, or a later attempt, may have the memory)."""
    try:
        return list(run(items))
    except Exception as exc:
        if not is_oom(exc):
            raise
        if on_oom is not None:
            on_oom()
        if len(items) <= 1:
            return [TransientEngineError(f"out of memory even for a single request: {exc}") for _ in items]
        mid = len(items) // 2
        return split_on_oom(items[:mid], run, is_oom, on_oom) + split_on_oom(items[mid:], run, is_oom, on_oom)


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# ---- log-likelihood scoring, as lm-evaluation-harness 0.4.13 tokenises and windows it ------


def encode_pair(
    encode: Callable[[str], list[int]], context: str, continuation: str
) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair for a causal model: the context's trailing spaces
    move to the continuation, context + continuation is encoded whole and the continuation's
    tokens are what follows the context's own encoding."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    context_ids = encode(context)
    return context_ids, whole[len(context_ids) :]


def rolling_windows(
    tokens: list[int], prefix_token: int, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """lm-eval's get_rolling_token_windows(context_len=1) through make_disjoint_window:
    (context, tokens to predict) pairs that predict every token once, the first one
    conditioned on `prefix_token`, each with as much of the preceding text as fits."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    out: list[tuple[list[int], list[int]]] = []
    if not tokens:
        return out
    first = min(max_length, len(tokens))
    windows = [([prefix_token, *tokens[: first - 1]], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, max_length)
        end = predicted + n
        windows.append((tokens[max(0, end - max_length - 1) : end - 1], tokens[end - n : end]))
        predicted += n
    for context, predict in windows:  # make_disjoint_window
        out.append((context[: len(context) - (len(predict) - 1)], predict))
    return out


@dataclass(frozen=True)
class ScoreRow:
    """One forward pass row: the model's input and the tokens its last positions predict."""

    owner: int  # the request it belongs to
    ids: list[int]  # (context + continuation)[-(max_length + 1):][:-1], as lm-eval feeds it
    targets: list[int]  # the continuation, predicted by the last len(targets) positions
    context_tokens: int  # before truncation
    truncated: bool


def score_row(owner: int, context: list[int], continuation: list[int], max_length: int) -> ScoreRow:
    """The row lm-eval's _loglikelihood_tokens makes of a (context, continuation) pair, the
    context cut from the left when the pair is longer than the context window."""
    if not continuation:
        raise PermanentEngineError(
            "the continuation has no tokens of its own (the tokenizer merged it into the context)"
        )
    if len(continuation) > max_length:
        raise PermanentEngineError(
            f"the continuation's {len(continuation)} tokens exceed the model's context window of {max_length}"
        )
    whole = context + continuation
    ids = whole[-(max_length + 1) :][:-1]
    return ScoreRow(owner, ids, continuation, len(context), len(whole) > max_length + 1)


def sampling_key(params: GenerationParams) -> tuple[Any, ...]:
    """Requests that can share one generate() call: max_tokens and stop strings are applied
    per row, and greedy decoding ignores top_p and seed."""
    if params.temperature == 0:
        return ("greedy",)
    return ("sample", params.temperature, params.top_p, params.seed)


# ---- the engine ---------------------------------------------------------------------------


@dataclass
class PreparedRequest:
    index: int  # position in the generate() call
    params: GenerationParams
    ids: list[int]
    original_tokens: int  # before truncation


# Tokens (rows x padded width) and rows of one scoring pass, per device kind. On the CPU a
# pass of several short rows reads the weights once instead of once per row (3-8x faster for
# 10-30 token rows than one row at a time, measured), while rows of 50 tokens and more are
# no faster together; passes stay small because the rows a call does not fill are computed
# anyway (plan_score_passes fixes a pass's rows per width). A pass keeps rows x kept
# positions x vocabulary logits (fp32): at most pass_tokens x vocabulary, or one row's.
SCORE_PASS_LIMITS = {"cpu": (256, 16), "cuda": (16384, 64)}
LOG_SOFTMAX_CHUNK = 1024  # positions normalised at once


class TokenizerEngine:
    """What every engine driven by a transformers tokenizer shares (hf:, ov:): the prompt
    rendered by the model's chat template (a raw prompt, GenRequest.prompt, as it is),
    requests checked, tokenised and truncated alike (a chat prompt in the middle, a raw one
    from the left as lm-eval does), grouped by sampling settings, and a failure of a group turned into a transient
    error of each of its requests. Subclasses set tokenizer, context_window and _lock and
    generate one group.

    Scoring (`loglikelihood`, `loglikelihood_rolling`) tokenises and windows as lm-eval does
    (encode_pair, rolling_windows, score_row; the context window is lm-eval's max_length),
    plans passes by length (plan_score_passes: right-padded rows, no attention mask, as
    lm-eval feeds them: a row's real tokens never see the padding after them; a pass's shape
    depends on each of its rows alone) and sums the log-softmax of the continuation's tokens;
    subclasses run one pass (_score_pass)."""

    tokenizer: Any
    context_window: int
    _lock: threading.Lock
    _end_ids: set[int]
    score_pass_tokens: int = SCORE_PASS_LIMITS["cpu"][0]
    score_max_rows: int = SCORE_PASS_LIMITS["cpu"][1]

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        if not self.tokenizer.chat_template:
            return plain_prompt(messages)
        rendered = self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )
        return str(rendered)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text))

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        results: list[GenOutput | EngineError | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[PreparedRequest]] = {}
        for i, request in enumerate(requests):
            try:
                prepared = self._prepare(i, request)
            except EngineError as exc:
                results[i] = exc
                continue
            groups.setdefault(sampling_key(request.params), []).append(prepared)
        with self._lock:
            for group in groups.values():
                try:
                    outs = self._generate_group(group)
                except Exception as exc:  # a bug or a device fault: let the retry path decide
                    log.exception("generation failed for a batch of %d", len(group))
                    why = f"generation failed: {type(exc).__name__}: {exc}"
                    outs = [TransientEngineError(why) for _ in group]  # one exception per request
                for p, out in zip(group, outs, strict=True):
                    results[p.index] = out
        return [r if r is not None else TransientEngineError("no result") for r in results]

    def _generate_group(self, group: list[PreparedRequest]) -> Sequence[GenOutput | EngineError]:
        raise NotImplementedError

    # -- scoring --

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        rows: list[ScoreRow] = []
        errors: dict[int, EngineError] = {}
        for i, request in enumerate(requests):
            try:
                context, continuation = self._score_pair(request.context, request.continuation)
                rows.append(score_row(i, context, continuation, self.context_window))
            except EngineError as exc:
                errors[i] = exc
            except Exception as exc:  # a tokenizer that rejects the text
                errors[i] = PermanentEngineError(f"cannot tokenise the request: {type(exc).__name__}: {exc}")
        return self._score_requests(len(requests), rows, errors)

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        rows: list[ScoreRow] = []
        errors: dict[int, EngineError] = {}
        for i, request in enumerate(requests):
            try:
                tokens = self._lm_encode(request.text)
                if not tokens:
                    raise PermanentEngineError("the document has no tokens")
                for context, predict in rolling_windows(tokens, self._prefix_token_id(), self.context_window):
                    rows.append(score_row(i, context, predict, self.context_window))
            except EngineError as exc:
                errors[i] = exc
            except Exception as exc:
                errors[i] = PermanentEngineError(f"cannot tokenise the document: {type(exc).__name__}: {exc}")
        return self._score_requests(len(requests), rows, errors)

    def _score_requests(
        self, n: int, rows: list[ScoreRow], errors: dict[int, EngineError]
    ) -> list[LLOutput | EngineError]:
        """Scores the rows and sums them per request (a rolling document has several)."""
        started = time.perf_counter()
        scores = self._score_rows(rows)
        latency_ms = (time.perf_counter() - started) * 1000
        totals: dict[int, list[Any]] = {}  # request -> [ll, greedy, read, scored, truncated]
        for row, score in zip(rows, scores, strict=True):
            if row.owner in errors:
                continue
            if isinstance(score, EngineError):
                errors[row.owner] = score
                totals.pop(row.owner, None)
                continue
            total = totals.setdefault(row.owner, [0.0, True, 0, 0, False])
            total[0] += score[0]
            total[1] = total[1] and score[1]
            total[2] += len(row.ids) + 1
            total[3] += len(row.targets)
            total[4] = total[4] or row.truncated
        out: list[LLOutput | EngineError] = []
        for i in range(n):
            if i in errors:
                out.append(errors[i])
            elif i in totals:
                ll, greedy, read, scored, truncated = totals[i]
                out.append(LLOutput(ll, greedy, read, scored, truncated, latency_ms))
            else:
                out.append(TransientEngineError("no score"))
        return out

    def _score_rows(self, rows: list[ScoreRow]) -> list[tuple[float, bool] | EngineError]:
        """Every row's (log-likelihood, greedy), in passes whose shape depends on each row
        alone (plan_score_passes), so that a row's numbers do not depend on the call."""
        out: list[tuple[float, bool] | EngineError | None] = [None] * len(rows)
        plan = plan_score_passes(
            [len(r.ids) for r in rows],
            [len(r.targets) for r in rows],
            pass_tokens=self.score_pass_tokens,
            max_rows=self.score_max_rows,
            cap=self.context_window,
        )
        with self._lock:
            for score_pass in plan:
                group = [rows[i] for i in score_pass.rows]

                def run(
                    part: Sequence[ScoreRow], p: ScorePass = score_pass, whole: list[ScoreRow] = group
                ) -> list[tuple[float, bool]]:
                    return self._run_pass(p, part, fill=part is whole)

                try:
                    scores = split_on_oom(group, run, self._is_oom)
                except Exception as exc:  # a bug or a device fault: let the retry path decide
                    log.exception("scoring failed for a pass of %d rows", len(group))
                    why = f"scoring failed: {type(exc).__name__}: {exc}"
                    scores = [TransientEngineError(why) for _ in group]
                for i, score in zip(score_pass.rows, scores, strict=True):
                    out[i] = score
        return [o if o is not None else TransientEngineError("no score") for o in out]

    def _run_pass(
        self, score_pass: ScorePass, rows: Sequence[ScoreRow], *, fill: bool = True
    ) -> list[tuple[float, bool]]:
        """The pass's rows, filled up to its size with repeats of the first. A part of a pass
        split after running out of memory runs as it is: smaller, so that it fits (its rows'
        numbers then differ from the planned pass's in the last digits)."""
        filled = [*rows, *[rows[0]] * (score_pass.size - len(rows))] if fill else list(rows)
        return self._score_pass(score_pass, filled)[: len(rows)]

    def _score_pass(self, score_pass: ScorePass, rows: Sequence[ScoreRow]) -> list[tuple[float, bool]]:
        raise NotImplementedError

    def _is_oom(self, exc: BaseException) -> bool:
        return _is_oom(exc)

    def _prefix_token_id(self) -> int:
        """lm-eval's HFLM.prefix_token_id: BOS, else EOS (the first token's condition)."""
        bos = self.tokenizer.bos_token_id
        return int(bos if bos is not None else self.tokenizer.eos_token_id)

    def _lm_encode(self, text: str, special: bool | None = None) -> list[int]:
        """lm-eval's HFLM.tok_encode: the tokenizer's own special tokens (a BOS where it adds
        one), unless the text already starts with the prefix token."""
        if special is None:
            prefix = self.tokenizer.decode([self._prefix_token_id()])
            special = not (prefix and text.startswith(prefix))
        ids: list[int] = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        return list(ids)

    def _score_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's TemplateLM.loglikelihood tokenisation, the empty context included."""
        if context == "":
            ids = self._lm_encode(continuation, special=False)
            prefix = self._prefix_token_id()
            return (ids[:1], ids[1:]) if ids and ids[0] == prefix else ([prefix], ids)
        return encode_pair(self._lm_encode, context, continuation)

    def _output(self, p: PreparedRequest, generated: list[int], latency_ms: float) -> GenOutput:
        """A row's generated ids as the answer: cut at the first end token, the row's own
        max_tokens and its first stop string (the model may run past them in a batch)."""
        n = next((k for k, t in enumerate(generated) if t in self._end_ids), len(generated))
        n = min(n, p.params.max_tokens)
        text, stopped = cut_at_stop(
            str(self.tokenizer.decode(generated[:n], skip_special_tokens=True)), p.params.stop
        )
        at_limit = n == p.params.max_tokens and not stopped
        extra = {"finish_reason": "length" if at_limit else "stop"}
        if len(p.ids) < p.original_tokens:
            extra["original_prompt_tokens"] = str(p.original_tokens)
        return GenOutput(
            text=text,
            prompt_tokens=len(p.ids),
            completion_tokens=n,
            truncated=len(p.ids) < p.original_tokens,
            latency_ms=latency_ms,
            extra=extra,
        )

    # -- internals --

    def _encode(self, text: str) -> list[int]:
        # rendered prompts already carry their special tokens: do not add a second BOS
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def _prepare(self, index: int, request: GenRequest) -> PreparedRequest:
        params = request.params
        problems = params.problems()
        if problems:
            raise PermanentEngineError("; ".join(problems))
        room = self.context_window - params.max_tokens
        if room < 1:
            raise PermanentEngineError(
                f"max_tokens={params.max_tokens} leaves no room for the prompt in this model's "
                f"context window of {self.context_window} tokens"
            )
        if request.prompt is not None:
            # a raw prompt: the text as it is, cut from the left when too long (lm-eval's
            # generate_until keeps a context's last max_length - max_gen_toks tokens)
            ids = self._encode(request.prompt)
            if not ids:
                raise PermanentEngineError("empty prompt")
            return PreparedRequest(
                index, params, ids[len(ids) - room :] if len(ids) > room else ids, len(ids)
            )
        try:
            ids = self._encode(self.render_prompt(request.messages))
        except Exception as exc:  # e.g. a chat template that rejects a role
            raise PermanentEngineError(f"cannot render the prompt: {exc}") from exc
        if not ids:
            raise PermanentEngineError("empty prompt")
        return PreparedRequest(index, params, truncate_middle(ids, room), len(ids))


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
        return split_on_oom(group, self._run_batch, _is_oom, self._free_memory)

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

    def _free_memory(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def sum_logprobs(logits: Any, targets: Sequence[list[int]]) -> list[tuple[float, bool]]:
    """(sum of log-softmax at the targets, every target the argmax) per row, from the kept
    logits of all rows one after the other (positions x vocabulary), as lm-eval computes
    them: log_softmax over the vocabulary, gathered, summed in one float32 sum per row."""
    import torch

    out: list[tuple[float, bool]] = []
    offset = 0
    for row in targets:
        wanted = torch.tensor(row, dtype=torch.long, device=logits.device)
        picked, greedy = [], True
        for start in range(0, len(row), LOG_SOFTMAX_CHUNK):
            end = min(start + LOG_SOFTMAX_CHUNK, len(row))
            # in fp32 whatever the model's dtype (a bf16 log-softmax loses ~3 digits; lm-eval
            # keeps the logits' dtype unless told otherwise: the same on the CPU's fp32)
            chunk = torch.log_softmax(logits[offset + start : offset + end].float(), dim=-1)
            part = wanted[start:end]
            picked.append(chunk.gather(1, part[:, None]).squeeze(1))
            greedy = greedy and bool((chunk.argmax(dim=-1) == part).all())
        out.append((float(torch.cat(picked).float().sum()), greedy))
        offset += len(row)
    if offset != logits.shape[0]:
        raise RuntimeError(f"{logits.shape[0]} logit rows for {offset} scored positions")
    return out


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
