"""Turning a raw model response into the text graders read."""

from __future__ import annotations

import re

CLEAN_VERSION = "1"  # part of every grader's version: changing the cleaning changes grades

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S | re.I)
_THINK_CLOSE = re.compile(r"</think>", re.I)
_THINK_OPEN = re.compile(r"<think>", re.I)
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)  # unclosed: to the end
_PYTHON_LANGS = {"", "python", "py", "python3"}
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")


def strip_think(text: str) -> str:
    """Removes reasoning, keeping whitespace (code indentation matters).

    Besides whole <think>...</think> blocks: everything up to a stray </think> (templates that
    open the block in the prompt, as DeepSeek-R1's does), and everything from an unclosed
    <think> on (reasoning cut off by max_tokens, so no answer was given).
    """
    text = _THINK_BLOCK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    if opened:
        text = text[: opened.start()]
    return text


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
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks:
        return _trim(text)
    candidates = [body for lang, body in blocks if lang in _PYTHON_LANGS] or [body for _, body in blocks]
    chosen = next((b for b in candidates if entry_point and defines(b, entry_point)), candidates[0])
    return _trim(chosen)


def _trim(code: str) -> str:
    return _LEADING_BLANK_LINES.sub("", code).rstrip()
