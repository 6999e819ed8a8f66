"""The prompt templates workers apply when a job gives none.

They live in the shared library, not in the worker, because the producer records in every
run manifest the template that will actually be used, and the producer's image carries no
worker code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from evalstream.common.keys import canonical_json

# Default instructions per grader: the answer must come out in a form the grader can read.
DEFAULT_TEMPLATES: dict[str, str] = {
    "numeric": "{question}\n\nWork it out, then give the final answer as a number on the last line.",
    "exact": "{question}\n\nAnswer in a few words.",
    "choice": "{question}\n\n{choices}\n\nAnswer with the letter of the correct choice.",
    "code": "Complete the following Python function. Reply with the whole function in one "
    "```python code block.\n\n```python\n{question}```",
}
FALLBACK_TEMPLATE = "{question}"  # a grader without a default of its own


def template_for(grader: str, template: str | None) -> str:
    """The template a worker applies for an item graded by `grader` (never "auto"; a grader
    SPEC's argument, as in "regex:^a", does not matter)."""
    return template or DEFAULT_TEMPLATES.get(grader.partition(":")[0], FALLBACK_TEMPLATE)


def effective_templates(template: str | None, graders: Iterable[str]) -> dict[str, str]:
    """grader -> the template used for its items. A job's own template applies to all of
    them; expressed the same way either way, so that an explicit template equal to the
    default one describes the same run."""
    return {g: template_for(g, template) for g in sorted(graders)}


def templates_sha256(templates: dict[str, str]) -> str:
    return hashlib.sha256(canonical_json(templates).encode()).hexdigest()
