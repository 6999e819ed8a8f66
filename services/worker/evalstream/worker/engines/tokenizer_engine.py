"""What every engine driven by a transformers tokenizer shares (hf:, ov:): TokenizerEngine,
and its pure helpers (unit-tested without a model): truncation, stop strings, splitting a
batch that ran out of memory, grouping by sampling settings.

torch is imported only to recognise its out-of-memory error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.worker.batching import ScorePass, plan_score_passes
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
from evalstream.worker.engines.loglikelihood import ScoreRow, encode_pair, rolling_windows, score_row
from evalstream.worker.engines.model_thread import on_model_thread
from evalstream.worker.engines.shared_context import SharedContextModel, score_shared, shareable

log = logging.getLogger("evalstream.worker.engines.hf")  # as before the split

T = TypeVar("T")
R = TypeVar("R")


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


def torch_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def sampling_key(params: GenerationParams) -> tuple[Any, ...]:
    """Requests that can share one generate() call: max_tokens and stop strings are applied
    per row, and greedy decoding ignores top_p and seed."""
    if params.temperature == 0:
        return ("greedy",)
    return ("sample", params.temperature, params.top_p, params.seed)


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
    subclasses run one pass (_score_pass). Pairs that hold their whole context run each
    distinct context once (shared_context.py; subclasses run its two passes). Every call
    runs on the process's model thread (model_thread.py)."""

    tokenizer: Any
    context_window: int
    _lock: threading.Lock
    _end_ids: set[int]
    score_pass_tokens: int = SCORE_PASS_LIMITS["cpu"][0]
    score_max_rows: int = SCORE_PASS_LIMITS["cpu"][1]
    shares_contexts: bool = True  # pairs run their context once (shared_context.py)

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

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
        return on_model_thread(self._generate_requests, requests)

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        return on_model_thread(self._loglikelihood, requests)

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        return on_model_thread(self._loglikelihood_rolling, requests)

    def _generate_requests(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
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

    def _loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
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
        return self._score_requests(len(requests), rows, errors, share=self.shares_contexts)

    def _loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
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
        self, n: int, rows: list[ScoreRow], errors: dict[int, EngineError], *, share: bool = False
    ) -> list[LLOutput | EngineError]:
        """Scores the rows and sums them per request (a rolling document has several)."""
        started = time.perf_counter()
        scores = self._score_rows(rows, share=share)
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

    def _score_rows(
        self, rows: list[ScoreRow], *, share: bool = False
    ) -> list[tuple[float, bool] | EngineError]:
        """Every row's (log-likelihood, greedy), in passes whose shape depends on each row
        alone (plan_score_passes), so that a row's numbers do not depend on the call; with
        `share`, the pairs that hold their whole context run it once (shared_context.py)."""
        out: list[tuple[float, bool] | EngineError | None] = [None] * len(rows)
        rest = list(range(len(rows)))  # rows run whole
        if share:
            shared = [i for i in rest if shareable(rows[i])]
            rest = [i for i in rest if not shareable(rows[i])]
            with self._lock:
                try:
                    for i, result in self._score_shared(rows, shared).items():
                        out[i] = result
                except Exception as exc:  # out of memory, a bug: the pairs run as whole rows
                    log.exception("scoring with shared contexts failed (%s): whole rows instead", exc)
                    rest += [i for i in shared if out[i] is None]
        plan = plan_score_passes(
            [len(rows[i].ids) for i in rest],
            [len(rows[i].targets) for i in rest],
            pass_tokens=self.score_pass_tokens,
            max_rows=self.score_max_rows,
            cap=self.context_window,
        )
        with self._lock:
            for score_pass in plan:
                group = [rows[rest[i]] for i in score_pass.rows]

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
                    out[rest[i]] = score
        return [o if o is not None else TransientEngineError("no score") for o in out]

    def _score_shared(self, rows: list[ScoreRow], indices: list[int]) -> dict[int, tuple[float, bool]]:
        if not indices:
            return {}
        return score_shared(
            cast(SharedContextModel, self),
            rows,
            indices,
            pass_tokens=self.score_pass_tokens,
            max_rows=self.score_max_rows,
            cap=self.context_window,
        )

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
        return torch_oom(exc)

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
