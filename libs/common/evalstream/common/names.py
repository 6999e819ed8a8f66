"""The one check of every id that becomes part of a Kafka key, a topic name, an S3 object
name or a path: run ids (from jobs, regrades, reproductions, redrives), worker group names.
A plain name is 1-128 characters of A-Z a-z 0-9 . _ -, the first a letter or digit, without
"..": nothing that could climb out of a prefix (`a/../b`), name another bucket, or carry
a separator the pipeline uses (`#` in shard keys, spread.py)."""

from __future__ import annotations

import re

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def plain_name_problem(value: object, what: str) -> str | None:
    """Why `value` is no plain name, or None."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value) or ".." in value:
        shown = repr(value[:80]) if isinstance(value, str) else type(value).__name__
        return f"{what} {shown} must be 1-128 characters of A-Z a-z 0-9 . _ - (the first a letter or digit), without '..'"
    return None


def is_plain_name(value: object) -> bool:
    return plain_name_problem(value, "") is None


def plain_name(value: str, what: str) -> str:
    """`value`, or ValueError when it is no plain name (a last guard where a name becomes a
    key or a path: whatever passed the earlier checks, nothing else gets through here)."""
    if problem := plain_name_problem(value, what):
        raise ValueError(problem)
    return value
