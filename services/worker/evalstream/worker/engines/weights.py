"""The weights an `hf:` or `ov:` engine loads, and their identity (part of its revision,
so of the answer-cache key).

A GGUF file is de-quantised by transformers once (~20 s for SmolLM2-135M on two CPU cores)
and cached as safetensors under MODEL_CACHE_DIR/<sha256[:16]>/ with its tokenizer; later
starts load that folder (~2 s). A model folder is used as it is, identified by a cheap
fingerprint of the files that matter.

torch and transformers are imported only while a cache is built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from evalstream.worker.engines import EngineConfigError

log = logging.getLogger("evalstream.worker.engines.hf")  # as before the split

CACHE_MARKER = "evalstream-cache.json"  # written last: a folder without it is incomplete
# files that determine a model folder's answers (README and the like do not)
_MODEL_FILE_SUFFIXES = {".safetensors", ".bin", ".json", ".model", ".jinja", ".txt"}


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
