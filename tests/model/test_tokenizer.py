"""The `ov:` engine's tokenizer without transformers (engines/tokenizer.py) against
transformers' own AutoTokenizer, on the bundled SmolLM2-135M-Instruct: the same chat prompts,
token ids and decoded texts, so that `ov:` answers what `hf:` answers (same prompt text,
cache key and ids); and the `ov:` engine, the default's engine on a CPU, loads without
importing torch or transformers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evalstream.common.settings import WorkerSettings
from evalstream.common.specs import BUNDLED_DEFAULT
from evalstream.worker.engines import bundled_model_path
from evalstream.worker.engines.hf import HFEngine
from evalstream.worker.engines.tokenizer import FastTokenizer, load_tokenizer
from evalstream.worker.engines.tokenizer_engine import TokenizerEngine
from evalstream.worker.engines.weights import resolve_weights

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "",
    "What is the capital of France?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "Ünïcödé: 日本語のテキスト, emoji 🚀🔥, Ελληνικά, עברית",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
    "<|endoftext|><repo_name>x<file_sep>",
    "def f(x):\n    return x ** 2  # code",
    "Question: Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18\n\nQuestion:",
    "a" * 300,
    "1,234.56 $7 -8 +9 ٣ ½",
]
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colors."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about <|im_end|> tokens."},
    ],
    [{"role": "user", "content": "Ünïcödé 🚀\n\n  spaced  "}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def folder() -> Path:
    path, _ = resolve_weights(
        bundled_model_path(BUNDLED_DEFAULT), WorkerSettings.from_env().resolved_model_cache_dir
    )
    return path


@pytest.fixture(scope="module")
def pair(folder: Path) -> tuple[FastTokenizer, Any]:
    from transformers import AutoTokenizer

    assert FastTokenizer.unsupported(folder) is None
    fast = load_tokenizer(folder)
    assert isinstance(fast, FastTokenizer)
    return fast, AutoTokenizer.from_pretrained(folder)


def test_special_tokens_are_transformers(pair: tuple[FastTokenizer, Any]) -> None:
    fast, slow = pair
    assert fast.special_tokens_map == slow.special_tokens_map
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id, fast.eos_token, fast.pad_token) == (
        slow.bos_token_id,
        slow.eos_token_id,
        slow.pad_token_id,
        slow.eos_token,
        slow.pad_token,
    )
    assert fast.chat_template == slow.chat_template


def test_ids_and_texts_are_transformers(pair: tuple[FastTokenizer, Any]) -> None:
    fast, slow = pair
    rng = random.Random(24)
    vocab = len(slow)
    for text in TEXTS:
        for special in (False, True):
            assert (
                fast(text, add_special_tokens=special)["input_ids"]
                == slow(text, add_special_tokens=special)["input_ids"]
            ), (text, special)
        ids = slow(text, add_special_tokens=False)["input_ids"]
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == slow.decode(ids, skip_special_tokens=skip)
    for _ in range(200):  # what a model may generate: any ids, special ones included
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == slow.decode(ids, skip_special_tokens=skip), (
                ids
            )


def test_chat_prompts_are_transformers(pair: tuple[FastTokenizer, Any]) -> None:
    fast, slow = pair
    for messages in CONVERSATIONS:
        for generation_prompt in (True, False):
            ours = fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            theirs = slow.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation_prompt
            )
            assert ours == theirs, messages


def test_the_engines_render_and_encode_alike(pair: tuple[FastTokenizer, Any], hf: HFEngine) -> None:
    """The hf engine (transformers' tokenizer) and a tokenizer engine on FastTokenizer give
    the same prompt text, ids and lm-eval encodings: ov: and hf: see the same tokens."""
    from evalstream.common.messages import ChatMessage

    class Borrowed(TokenizerEngine):
        def __init__(self, tokenizer: FastTokenizer) -> None:
            self.tokenizer = tokenizer

    fast, _ = pair
    borrowed = Borrowed(fast)
    for messages in CONVERSATIONS:
        chat = [ChatMessage(m["role"], m["content"]) for m in messages]
        prompt = borrowed.render_prompt(chat)
        assert prompt == hf.render_prompt(chat)
        assert borrowed._encode(prompt) == hf._encode(prompt)
    for text in TEXTS[1:]:
        assert borrowed._lm_encode(text) == hf._lm_encode(text)
        assert borrowed._score_pair(text, " continued") == hf._score_pair(text, " continued")


def test_a_tokenizer_transformers_would_change_is_left_to_transformers(folder: Path, tmp_path: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for change, words in (
        ({"tokenizer_class": "LlamaTokenizerFast"}, "not a generic fast tokenizer"),
        ({"add_bos_token": True}, "sets add_bos_token"),
        ({"bos_token": "<s>"}, "is not a special added token"),
    ):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
        why = FastTokenizer.unsupported(tmp_path)
        assert why is not None and words in why, change


def test_the_default_loads_on_a_cpu_without_torch_or_transformers() -> None:
    """In a fresh interpreter, as a worker starts: the bundled model's name resolves to `ov:`
    on this CPU machine, and neither torch nor transformers is imported to load it."""
    code = (
        "import sys, json\n"
        "from evalstream.common.settings import WorkerSettings\n"
        "from evalstream.worker.engines import device_kind, load_engine\n"
        "e = load_engine('smollm2-135m-instruct', WorkerSettings.from_env())\n"
        "print(json.dumps([device_kind(), e.name, type(e.tokenizer).__name__,"
        " 'torch' in sys.modules, 'transformers' in sys.modules]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT, check=True
    )
    kind, name, tokenizer, torch, transformers = json.loads(proc.stdout.strip().splitlines()[-1])
    if kind != "cpu":  # a CUDA machine: the default resolves to torch there
        assert name == "hf:smollm2-135m-instruct", name
        return
    assert (name, tokenizer, torch, transformers) == (
        "ov:smollm2-135m-instruct",
        "FastTokenizer",
        False,
        False,
    )
