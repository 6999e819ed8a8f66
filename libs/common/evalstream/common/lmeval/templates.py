"""Jinja rendering of task templates, as lm-eval's `utils.apply_template` renders them
(`Environment(undefined=StrictUndefined, keep_trailing_newline=True)` with its `regex_replace`
filter), but in an immutable sandbox: no attribute that reaches Python internals, no mutating
method, no template loader (`{% include %}` reads no file), and bounds on what one
expression may build: strings and lists made by `*` and `+`, powers, widths of padding
filters, batches. Each render's output is capped. What a bound cannot stop (a pattern of
`regex_replace` that backtracks, deeply nested loops over a long field) the reader's process
limits stop (evalstream.common.lmeval.isolation)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from evalstream.common.lmeval.errors import TaskDataError

MAX_RENDER_CHARS = 2_000_000  # one render (a context with many few-shot examples is ~100 kB)
MAX_BUILT = 2_000_000  # characters or elements one `*` / `+` / filter may build
MAX_EXPONENT = 128
MAX_TEMPLATE_CHARS = 100_000
_CACHE_LIMIT = 256
_WIDE_FORMAT = re.compile(r"%[-+ #0]*(?:\*|\d{7,})|%[-+ #0]*\d*\.(?:\*|\d{7,})")


def regex_replace(text: str, pattern: str, repl: str, count: int = 0) -> str:
    """lm-eval's regex_replace filter (re.sub)."""
    return re.sub(pattern, repl, text, count=count)


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, str | list | tuple) else None


class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(right, int | float) and abs(right) > MAX_EXPONENT:
                raise TemplateError(f"exponent {right} over {MAX_EXPONENT}")
            if isinstance(left, int) and left.bit_length() * abs(int(right)) > 8 * MAX_BUILT:
                raise TemplateError("a power over the size bound")
        elif operator == "%":
            if isinstance(left, str) and _WIDE_FORMAT.search(left):
                raise TemplateError("a %-format width over the size bound")
        elif operator == "*":
            for seq, times in ((left, right), (right, left)):
                n = _size(seq)
                if n is not None and isinstance(times, int) and n * max(times, 0) > MAX_BUILT:
                    raise TemplateError(f"a repetition of {n} x {times} over {MAX_BUILT}")
        elif operator == "+":
            a, b = _size(left), _size(right)
            if a is not None and b is not None and a + b > MAX_BUILT:
                raise TemplateError(f"a concatenation over {MAX_BUILT}")
        return super().call_binop(context, operator, left, right)


def _bounded(name: str, f: Callable[..., Any], width_args: tuple[int, ...]) -> Callable[..., Any]:
    """A filter whose numeric arguments (at positions `width_args`, after the value) are
    bounded, so that `'x'|center(10**9)` builds nothing."""

    shift = 1 if hasattr(f, "jinja_pass_arg") else 0  # the environment or context comes first

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for i in (p + shift for p in width_args):
            if i < len(args) and isinstance(args[i], int) and abs(args[i]) > MAX_BUILT:
                raise TemplateError(f"{name}: argument {args[i]} over {MAX_BUILT}")
        for v in kwargs.values():
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_BUILT:
                raise TemplateError(f"{name}: argument {v} over {MAX_BUILT}")
        return f(*args, **kwargs)

    if shift:
        wrapper.jinja_pass_arg = f.jinja_pass_arg  # type: ignore[attr-defined]
    return wrapper


def _replace(value: Any, old: Any, new: Any, count: int | None = None) -> Any:
    text, o, n = str(value), str(old), str(new)
    occurrences = len(text) + 1 if o == "" else text.count(o)
    if count is not None and count >= 0:
        occurrences = min(occurrences, count)
    if len(text) + occurrences * len(n) > MAX_BUILT:
        raise TemplateError(f"replace: the result would be over {MAX_BUILT} characters")
    return text.replace(o, n) if count is None else text.replace(o, n, count)


def _environment() -> _Environment:
    env = _Environment(undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = regex_replace
    env.filters["replace"] = _replace
    # positions are those of jinja2's own filter functions (the value is argument 0)
    for name, positions in {
        "center": (1,),
        "indent": (1,),
        "wordwrap": (1,),
        "truncate": (1,),
        "batch": (1,),
        "slice": (1,),
    }.items():
        env.filters[name] = _bounded(name, env.filters[name], positions)
    env.filters.pop("format", None)  # printf-style widths ("%999999999s") build anything
    return env


_env = _environment()
_compiled: dict[str, Any] = {}


def render(template: str, doc: Mapping[str, Any]) -> str:
    """The template rendered with the document's fields as variables. Raises TaskDataError."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TaskDataError(f"a template over {MAX_TEMPLATE_CHARS} characters")
    compiled = _compiled.get(template)
    try:
        if compiled is None:
            compiled = _env.from_string(template)
            if len(_compiled) < _CACHE_LIMIT:
                _compiled[template] = compiled
        out: list[str] = []
        size = 0
        for chunk in compiled.generate(**doc):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise TaskDataError(f"a template renders over {MAX_RENDER_CHARS} characters")
            out.append(chunk)
    except TaskDataError:
        raise
    except TemplateError as exc:
        raise TaskDataError(f"template {_clip(template)!r}: {type(exc).__name__}: {exc}") from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, re.error) as exc:
        raise TaskDataError(f"template {_clip(template)!r}: {type(exc).__name__}: {exc}") from None
    except RecursionError:
        raise TaskDataError(f"template {_clip(template)!r}: nested too deeply") from None
    return "".join(out)


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[:n] + "..."
