"""Regular expressions that come from jobs and datasets (`regex:<pattern>`, `meta.regex`, gold
answers used as patterns), matched in linear time wherever the pattern allows it.

They are written in Python `re` syntax, and Python's engine backtracks: `(a+)+$` over
"a" * 30 + "!" runs for minutes. RE2 (google-re2) matches in time linear in the text, so a
pattern RE2 reads the same way runs there; any other one (backreferences, lookarounds,
possessive quantifiers...) runs in Python's engine, which is safe only because graders run
in the grading pool, whose per-item deadline kills a match that overruns (grading_pool.py).

RE2 reads a few things differently from Python, and such patterns also go to Python's
engine: `{,n}` (a literal in RE2, `{0,n}` in Python), `[[:alpha:]]` (a POSIX class in RE2,
a set in Python), `$` on text ending in a newline (Python's `$` also matches before it), and,
on text with non-ASCII characters or the ASCII separators \\v and \\x1c-\\x1f, the classes
\\w \\W \\d \\D \\s \\S \\b \\B (Unicode-wide in Python, ASCII in RE2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, Protocol

import re2

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a pattern RE2 cannot read is expected, not worth a log line
_UNICODE_SENSITIVE = frozenset("wWdDsSbB")  # escapes whose meaning depends on the text's alphabet
_PYTHON_ONLY_SPACES = re.compile(r"[\x0b\x1c-\x1f]")  # \s in Python, not in RE2


class MatchLike(Protocol):
    def __getitem__(self, group: int) -> str | Any: ...

    def start(self) -> int: ...

    def end(self) -> int: ...


class UserPattern:
    """A compiled user pattern; `finditer` picks the engine for the text it is given."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.python = re.compile(pattern)  # raises re.error: the pattern is checked as Python reads it
        self.groups = self.python.groups
        self.re2 = _re2_version(pattern)
        self.unicode_sensitive = _uses_unicode_classes(pattern)
        self.has_dollar = "$" in pattern

    @property
    def engine(self) -> str:
        """ "re2" when every text runs there, "re2/python" when some texts do, else "python"."""
        if self.re2 is None:
            return "python"
        return "re2/python" if self.unicode_sensitive else "re2"

    def finditer(self, text: str) -> Iterator[MatchLike]:
        if self._re2_reads_like_python(text):
            return iter(self.re2.finditer(text))
        return self.python.finditer(text)

    def findall(self, text: str) -> list[Any]:
        """Python's re.findall (the whole match, the one group's text, or a tuple of every
        group's, "" where a group took no part), on the engine `finditer` picks."""
        if self.groups == 0:
            return [m[0] for m in self.finditer(text)]
        if self.groups == 1:
            return [m[1] or "" for m in self.finditer(text)]
        return [tuple(m[g] or "" for g in range(1, self.groups + 1)) for m in self.finditer(text)]

    def sub(self, repl: str, text: str) -> str:
        """Python's re.sub with a literal replacement (lm-eval's regexes_to_ignore remove
        what they match), on the engine `finditer` picks."""
        if "\\" in repl:
            raise ValueError("only a literal replacement (no group references)")
        pieces: list[str] = []
        last = 0
        for m in self.finditer(text):
            pieces += (text[last : m.start()], repl)
            last = m.end()
        pieces.append(text[last:])
        return "".join(pieces)

    def _re2_reads_like_python(self, text: str) -> bool:
        if self.re2 is None or (self.has_dollar and text.endswith("\n")):
            return False
        return not self.unicode_sensitive or (text.isascii() and not _PYTHON_ONLY_SPACES.search(text))


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> UserPattern:
    """Raises re.error for a pattern Python cannot compile."""
    return UserPattern(pattern)


def _re2_version(pattern: str) -> Any:
    """The pattern compiled by RE2, or None where RE2 cannot read it or would read it
    differently from Python."""
    if "{," in pattern or "[:" in pattern:
        return None
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error:
        return None
    return compiled if compiled.groups == re.compile(pattern).groups else None


def _uses_unicode_classes(pattern: str) -> bool:
    escaped = False
    for char in pattern:
        if escaped:
            if char in _UNICODE_SENSITIVE:
                return True
            escaped = False
        elif char == "\\":
            escaped = True
    return False
