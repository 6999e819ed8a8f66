"""The tokenizer of an `hf:`/`ov:` model folder without importing transformers (and torch),
where that is exactly what transformers would do.

Importing transformers imports torch: seconds on a worker's start (bench/worker_start.py)
that the `ov:` engine, which runs on OpenVINO, does not need. A model folder whose tokenizer
is transformers' generic fast tokenizer (`TokenizersBackend` / `PreTrainedTokenizerFast`,
with nothing that makes transformers change the `tokenizers` object it loads) is read here
with `tokenizers` and `jinja2` alone: encoding, decoding and the chat template rendered as
transformers 5 renders it (`apply_chat_template(..., tokenize=False)`: the same sandboxed
Jinja environment, filters, globals and special-token variables). Any other folder gets
transformers' own AutoTokenizer (`load_tokenizer`). tests/model/test_tokenizer.py checks
both give the same prompts, ids and texts on the bundled model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# transformers' generic fast-tokenizer classes: no model-specific code around `tokenizers`
GENERIC_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# transformers patches a pre-tokenizer of vocabularies this large (Mistral's regex)
MAX_PLAIN_VOCAB = 100_000


def load_tokenizer(folder: Path) -> Any:
    """The model folder's tokenizer: a FastTokenizer where it reads the folder exactly as
    transformers would, else transformers' AutoTokenizer."""
    why = FastTokenizer.unsupported(folder)
    if why is None:
        try:
            return FastTokenizer(folder)
        except (OSError, ValueError, ImportError) as exc:  # ValueError: json, tokenizers, jinja2
            why = f"{type(exc).__name__}: {exc}"
    log.info("tokenizer of %s through transformers: %s", folder, why)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class _Folder:
    config: dict[str, Any]
    tokenizer_json: dict[str, Any]
    chat_template: str | None


def _read(folder: Path) -> _Folder:
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    template = config.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():  # transformers prefers the separate file
        template = jinja.read_text(encoding="utf-8")
    return _Folder(config, data, template if isinstance(template, str) else None)


class FastTokenizer:
    """What the engines use of a transformers tokenizer: `tok(text, add_special_tokens)
    ["input_ids"]`, `decode(ids, skip_special_tokens)`, `apply_chat_template(messages,
    tokenize=False, add_generation_prompt)`, `chat_template`, the special tokens and their ids."""

    @staticmethod
    def unsupported(folder: Path) -> str | None:
        """Why transformers would read `folder`'s tokenizer differently from FastTokenizer
        (or cannot be matched without it), or None."""
        try:
            f = _read(folder)
        except (OSError, ValueError) as exc:
            return f"no tokenizer_config.json/tokenizer.json to read: {exc}"
        config, data = f.config, f.tokenizer_json
        if config.get("tokenizer_class") not in GENERIC_CLASSES:
            return f"tokenizer class {config.get('tokenizer_class')!r} is not a generic fast tokenizer"
        for key in ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces", "split_special_tokens"):
            if config.get(key):
                return f"tokenizer_config.json sets {key}"
        if config.get("extra_special_tokens") or config.get("additional_special_tokens"):
            return "extra special tokens"
        if data.get("truncation") is not None or data.get("padding") is not None:
            return "tokenizer.json sets truncation or padding"
        if data.get("post_processor") is None:
            return "tokenizer.json has no post-processor (transformers makes one)"
        vocab = (data.get("model") or {}).get("vocab") or {}
        if len(vocab) + len(data.get("added_tokens") or []) > MAX_PLAIN_VOCAB:
            return "a vocabulary large enough for transformers to patch its pre-tokenizer"
        added = {a.get("content"): a for a in data.get("added_tokens") or []}
        for name in SPECIAL_NAMES:
            text = _token_text(config.get(name))
            if text is not None and not (text in added and added[text].get("special")):
                return f"{name} {text!r} is not a special added token of tokenizer.json"
        declared = config.get("added_tokens_decoder") or {}
        for entry in declared.values():
            content = entry.get("content") if isinstance(entry, dict) else None
            if content not in added or bool(added[content].get("special")) != bool(entry.get("special")):
                return f"added token {content!r} of tokenizer_config.json differs from tokenizer.json's"
        if f.chat_template is None and "chat_template" in config:
            return "named chat templates"
        return None

    def __init__(self, folder: Path) -> None:
        import tokenizers

        f = _read(folder)
        self._tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.chat_template = f.chat_template
        self.special_tokens_map: dict[str, str] = {
            name: text for name in SPECIAL_NAMES if (text := _token_text(f.config.get(name))) is not None
        }
        self._template: Any = None

    # -- special tokens

    def _id(self, name: str) -> int | None:
        text = self.special_tokens_map.get(name)
        return None if text is None else self._tokenizer.token_to_id(text)

    @property
    def bos_token_id(self) -> int | None:
        return self._id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self.special_tokens_map.get("pad_token")

    @pad_token.setter
    def pad_token(self, value: str) -> None:
        self.special_tokens_map["pad_token"] = value

    # -- text

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str:
        """transformers 5's rendering of one conversation of plain messages (no tools, no
        documents): its template compiled in its environment, given its special tokens."""
        if tokenize:
            raise ValueError("FastTokenizer renders text only (tokenize=False)")
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return str(
            self._template.render(
                messages=chat,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens_map,
            )
        )


@cache
def compile_chat_template(template: str) -> Any:
    """A chat template compiled as transformers' _cached_compile_jinja_template compiles it:
    an immutable sandbox, trim_blocks and lstrip_blocks, loop controls, its tojson filter
    (no HTML escaping), raise_exception, strftime_now, a plain dict() and a namespace that
    refuses underscored names, and a `{% generation %}` block that renders its body."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it so)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"no underscore-prefixed attributes on a namespace: {name!r}"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)
