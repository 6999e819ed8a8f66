"""What the lm-eval task reader raises: a refusal always names the YAML key (or the file, or
the document) it is about, so that nothing it cannot reproduce passes unnoticed."""

from __future__ import annotations


class TaskError(Exception):
    """A task that cannot be read or rendered. `key` is the YAML key (dotted, with list
    indices: `filter_list[0].filter[1].function`), or None for the file as a whole."""

    def __init__(self, message: str, *, key: str | None = None, where: str | None = None) -> None:
        self.message = message
        self.key = key
        self.where = where  # a file (relative to the task root) or a task name
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.where, self.key) if p]
        return f"{': '.join(parts)}: {self.message}" if parts else self.message


class TaskRefused(TaskError):
    """The task asks for something this reader does not do (a `!function`, an unsupported
    key, metric, filter or sampler): refused rather than ignored."""


class TaskDataError(TaskError):
    """The task's data cannot be read (missing file, hub name without a local copy, a file
    outside the allowed folders) or does not render (a template error on a document)."""
