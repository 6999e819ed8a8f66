"""Turning a raw model response into the text graders read."""

from __future__ import annotations

import json
import re
from typing import Any

# Changing the cleaning changes grades: bump CLEAN_VERSION in evalstream.common.graders.

# Responses are untrusted and may be huge: every scan here is linear in the text (no pattern
# that can backtrack over a long run), e.g. "<think>" * 15000 or "```" + "a" * 50000.
_THINK_TAG = re.compile(r"<(/?)think>", re.I)
_FENCE_INFO = re.compile(r"[ \t]*+([\w+#.-]*+)")  # the language tag on a fence's first line
_PYTHON_LANGS = {"", "python", "py", "python3"}
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")
_JSON_LANGS = {"", "json", "jsonc", "json5"}
_JSON_START = re.compile(r"[{\[]")
_MAX_JSON_SCAN = 100_000  # characters; a JSON answer is far shorter
_MAX_JSON_STARTS = 500  # bounds the work on brace-heavy text that never parses
_decoder = json.JSONDecoder()


def strip_think(text: str) -> str:
    """Removes reasoning, keeping whitespace (code indentation matters).

    Besides whole <think>...</think> blocks: everything up to a stray </think> (templates that
    open the block in the prompt, as DeepSeek-R1's does), and everything from an unclosed
    <think> on (reasoning cut off by max_tokens, so no answer was given).
    """
    text = _without_think_blocks(text)
    last_close = None
    for tag in _THINK_TAG.finditer(text):
        if tag[1]:
            last_close = tag
    if last_close is not None:
        text = text[last_close.end() :]
    opened = _THINK_TAG.search(text)  # no close is left: any tag is an opening one
    if opened:
        text = text[: opened.start()]
    return text


def _without_think_blocks(text: str) -> str:
    """Every <think>...</think> removed, each opening tag paired with the first closing tag
    after it (as a lazy regex would pair them), in one pass over the tags."""
    kept: list[str] = []
    pos = 0  # end of the last removed block
    opened: int | None = None  # start of an opening tag waiting for its close
    for tag in _THINK_TAG.finditer(text):
        if opened is None and not tag[1]:
            opened = tag.start()
        elif opened is not None and tag[1]:
            kept.append(text[pos:opened])
            pos, opened = tag.end(), None
    return "".join(kept) + text[pos:] if kept else text


def clean_response(text: str) -> str:
    """The answer part of a response: reasoning removed, surrounding whitespace stripped."""
    return strip_think(text).strip()


def defines(code: str, name: str) -> bool:
    """Whether `code` defines the function `name` at top level."""
    pattern = rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\("
    return re.search(pattern, code, re.M) is not None


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The program in a response: the ``` fenced block that defines `entry_point` (Python or
    untagged blocks first; any block when there are none), else the first such block; the
    whole text when there are no fences. Leading blank lines and trailing whitespace are
    dropped but not the first line's indentation: a HumanEval completion that does not define
    `entry_point` is a body continuation, which the code_exec grader appends to the prompt."""
    blocks = [(lang.lower(), body) for lang, body in fenced_blocks(text)]
    if not blocks:
        return _trim(text)
    candidates = [body for lang, body in blocks if lang in _PYTHON_LANGS] or [body for _, body in blocks]
    chosen = next((b for b in candidates if entry_point and defines(b, entry_point)), candidates[0])
    return _trim(chosen)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every ``` block, left to right; an unclosed one runs to the end.
    A fence opens at ```, its tag is the word after it, the rest of that line is ignored, and
    the body starts on the next line."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while (start := text.find("```", pos)) >= 0:
        newline = text.find("\n", start + 3)
        if newline < 0:  # no line break after this fence, so none after any later one either
            break
        info = _FENCE_INFO.match(text, start + 3, newline)
        lang = info[1] if info else ""
        end = text.find("```", newline + 1)
        blocks.append((lang, text[newline + 1 : end if end >= 0 else len(text)]))
        if end < 0:
            break
        pos = end + 3
    return blocks


def _trim(code: str) -> str:
    return _LEADING_BLANK_LINES.sub("", code).rstrip()


def extract_json(text: str) -> dict[str, Any] | list[Any] | None:
    """The JSON object or array in a response: the last ``` block (json or untagged) that
    parses, else the last top-level object or array found in the text ("Here you go:
    {"a": 1} Hope it helps." -> {"a": 1}); None when there is none. Scalars are not
    extracted: a bare number or word in prose is not a JSON answer."""
    text = strip_think(text)[:_MAX_JSON_SCAN]
    fenced = [body for lang, body in fenced_blocks(text) if lang.lower() in _JSON_LANGS]
    for body in reversed(fenced):
        found = _json_values(body)
        if found:
            return found[-1]
    found = _json_values(text)
    return found[-1] if found else None


def _json_values(text: str) -> list[dict[str, Any] | list[Any]]:
    """Every top-level JSON object or array in `text`, left to right; what lies inside one
    found value is not searched again."""
    out: list[dict[str, Any] | list[Any]] = []
    pos = 0
    for _ in range(_MAX_JSON_STARTS):
        m = _JSON_START.search(text, pos)
        if m is None:
            break
        try:
            value, end = _decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            pos = m.start() + 1
            continue
        out.append(value)
        pos = end
    return out
