"""JSON answers: a field of the JSON in the response against the gold answer.

The JSON is what cleaning pulls out of the response (a ```json block, else the last object or
array in the text). The field is the item's `meta.json_field`, else the job's
(`json:answer.value`; list indices as numbers: `items.0.name`); without one, the whole
document is compared. Equal means: as numbers when both read as numbers (numeric's
tolerance: gold "25%" or "1e3" against 25 or 1000.0); as JSON values when the gold answer is
a JSON object, array, true, false or null; else as text, normalised as `exact` does.
"""

from __future__ import annotations

import json
import math
from typing import Any

from evalstream.common.gold import field_for, normalize, parse_number
from evalstream.common.gold import json_problem as problem
from evalstream.common.graders import GRADER_VERSIONS, json_path
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import extract_json
from evalstream.worker.grading.numeric import ABS_TOL, REL_TOL

GRADER_VERSION = GRADER_VERSIONS["json"]  # bump it there: run manifests record it
MAX_EXTRACTED = 2000

_MISSING = object()


def lookup(document: Any, path: str | None) -> Any:
    """The value at `path` in `document` (the whole of it for None), or _MISSING."""
    value = document
    for step in json_path(path) if path else []:
        if isinstance(value, dict) and str(step) in value:
            value = value[str(step)]
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return _MISSING
    return value


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return parse_number(value) if isinstance(value, str) else None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def values_match(value: Any, gold: str) -> bool:
    gold_number, number = parse_number(gold), _as_number(value)
    if gold_number is not None and number is not None:
        return math.isclose(number, gold_number, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    try:
        gold_value = json.loads(gold)
    except ValueError:
        gold_value = _MISSING
    if gold_value is None or isinstance(gold_value, dict | list | bool):
        return _canonical(value) == _canonical(gold_value)  # the exact structure: true is not 1
    return isinstance(value, str | int | float) and normalize(str(value)) == normalize(gold)


def json_field(default: str | None = None) -> Grader:
    def grade(response: str, item: Item) -> Grade:
        require(problem(item, default))
        path = field_for(item, default)
        document = extract_json(response)
        if document is None:
            return Grade(extracted=None, correct=False, score=0.0, detail="no JSON in the response")
        value = lookup(document, path)
        if value is _MISSING:
            return Grade(extracted=None, correct=False, score=0.0, detail=f"no field {path!r} in the JSON")
        extracted = value if isinstance(value, str) else _canonical(value)
        correct = values_match(value, item.answer or "")
        detail = None if correct else f"expected {item.answer!r}"
        return Grade(
            extracted=extracted[:MAX_EXTRACTED], correct=correct, score=float(correct), detail=detail
        )

    return grade
