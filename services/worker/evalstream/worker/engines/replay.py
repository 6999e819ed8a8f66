"""`replay:<file.jsonl>`: answers produced elsewhere, so that a run can grade them.

Lines are `{"id": ..., "response": ...}` or human-eval samples `{"task_id": ..., "completion":
...}` (the completion then continues the task's prompt; `extra["replay_format"]` says so). With
several samples for one id (pass@k files), the first one is served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from evalstream.common.messages import ChatMessage
from evalstream.worker.engines import EngineConfigError
from evalstream.worker.engines.base import EngineError, GenOutput, GenRequest, PermanentEngineError
from evalstream.worker.engines.null import plain_prompt, word_count

_FORMATS = {("id", "response"): "response", ("task_id", "completion"): "human-eval"}


class ReplayEngine:
    device = "none"

    def __init__(self, path: str | Path, *, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or f"replay:{self.path}"
        data = self.path.read_bytes()
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
        for (id_key, text_key), fmt in _FORMATS.items():
            if id_key in record and text_key in record:
                item_id, text = record[id_key], record[text_key]
                if not isinstance(item_id, str | int) or not isinstance(text, str):
                    raise EngineConfigError(f"{where}: {id_key} must be a string or int, {text_key} a string")
                return str(item_id), text, fmt
        raise EngineConfigError(f'{where}: expected {{"id", "response"}} or {{"task_id", "completion"}}')

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
                    prompt_tokens=word_count(plain_prompt(r.messages)),
                    completion_tokens=word_count(text),
                    extra={"replay_format": fmt},
                )
            )
        return out

    def close(self) -> None:
        pass
