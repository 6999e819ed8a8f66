"""The `openai:` engine's wire format: request bodies for the chat-completions endpoint and,
for a raw prompt (GenRequest.prompt, lm-eval tasks), the completions endpoint (`prompt`,
continued as it is: no chat template on either side); what a request costs a provider's
buckets; the answers read back, their size capped; and the key, sent in the Authorization
header alone. Token usage comes from the response's `usage`; a server that sends none
reports 0 completion tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from evalstream.common.messages import ChatMessage, GenerationParams


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


def parse_completion(body: bytes) -> Completion:
    """The first choice of a chat-completions response. Raises ValueError if the body is
    not one (malformed JSON, an error object, no choices)."""
    data, choice = _first_choice(body)
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message content is a {type(content).__name__}, not text")
    return _completion(data, choice, content)


def parse_text_completion(body: bytes) -> Completion:
    """The first choice of a (text) completions response, as parse_completion reads a chat one:
    `choices[0].text`. Raises ValueError if the body is not one."""
    data, choice = _first_choice(body)
    text = choice.get("text") if isinstance(choice, dict) else None
    if text is not None and not isinstance(text, str):
        raise ValueError(f"completion text is a {type(text).__name__}, not text")
    return _completion(data, choice, text)


def _first_choice(body: bytes) -> tuple[dict[str, Any], Any]:
    """(the response, its first choice). Raises ValueError: malformed JSON, no choices."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("no choices in the response")
    return data, data["choices"][0]


def _completion(data: dict[str, Any], choice: Any, text: str | None) -> Completion:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    try:
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        raise ValueError(f"unreadable usage {usage!r}") from None
    return Completion(text or "", prompt_tokens, completion_tokens, choice.get("finish_reason"))


def request_costs(body: Mapping[str, Any]) -> dict[str, float]:
    """What a request takes from a provider's buckets: one request, and tokens as OpenAI
    counts them on admission (about 4 characters a token of prompt, plus max_tokens)."""
    chars = sum(len(str(m.get("content") or "")) for m in body.get("messages") or [] if isinstance(m, dict))
    chars += len(str(body.get("prompt") or ""))  # a completions request (log-likelihood scoring)
    return {"requests": 1.0, "tokens": float(math.ceil(chars / 4) + int(body.get("max_tokens") or 0))}


def request_body(model: str, messages: list[ChatMessage], params: GenerationParams) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
    }
    return {**body, **_sampling(params)}


def text_request_body(model: str, prompt: str, params: GenerationParams) -> dict[str, Any]:
    """A completions request: the raw prompt, continued as it is (no chat template)."""
    return {"model": model, "prompt": prompt, **_sampling(params)}


def _sampling(params: GenerationParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.temperature > 0:
        out["seed"] = params.seed  # honoured by OpenAI and vLLM; ignored by others
    if params.stop:
        out["stop"] = params.stop
    return out


async def read_capped(response: httpx.Response, limit: int) -> bytes | None:
    """The body, or None as soon as it grows past `limit` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class BearerAuth(httpx.Auth):
    """Adds the key to each request; its repr never shows it."""

    def __init__(self, key: str) -> None:
        self._key = key

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._key}"
        yield request

    def __repr__(self) -> str:
        return "BearerAuth(***)"
