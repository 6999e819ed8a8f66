"""Model-graded answers: another model (any model SPEC: `judge:openai:gpt-4o@https://...`,
`judge:replay:verdicts.jsonl`, `judge:hf:...`) reads the question, the reference answer
when there is one, the response and a rubric, and gives a verdict.

The rubric is the item's `meta.rubric`, else DEFAULT_RUBRIC. The judge must end its reply
with a line `VERDICT: CORRECT` or `VERDICT: INCORRECT`; the last such line counts (its
reasoning before it, and any <think> block, are ignored). A reply without a verdict grades
as wrong, with the reply's start in `detail`. A judge engine that fails (rate limits after
its retries...) raises its EngineError, so the item is retried like any engine failure.

The judge's engine is loaded once per worker through load_engine, like any model: only if
the group's allow-list (WORKER_MODEL) covers it (else the item fails with NotServed and no
request is made), with the key the operator mapped to its endpoint (WORKER_API_KEYS), if
any. It is called greedily with JUDGE_PARAMS; a replay judge answers by item id.
"""

from __future__ import annotations

import contextlib
import re
import threading

from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import ChatMessage, GenerationParams, Item
from evalstream.common.settings import WorkerSettings
from evalstream.worker.engines import Engine, EngineError, GenRequest, load_engine
from evalstream.worker.grading.base import Grade, Grader
from evalstream.worker.grading.clean import clean_response

GRADER_VERSION = GRADER_VERSIONS["judge"]  # bump it there: run manifests record it
JUDGE_PARAMS = GenerationParams(max_tokens=512, temperature=0.0)
MAX_DETAIL = 300

DEFAULT_RUBRIC = (
    "The response is correct if it answers the question and, when a reference answer is "
    "given, agrees with it. Wording, formatting and extra explanation do not matter; a "
    "response that hedges between several answers is incorrect."
)
JUDGE_SYSTEM = "You are a strict, fair grader of answers to questions."
_VERDICT = re.compile(r"verdict[\s:=*_`\"'\-]*(correct|incorrect)\b", re.I)
_LONE = re.compile(r"[*_`\"'\s]*(correct|incorrect)[*_`\"'.!\s]*", re.I)


def rubric_for(item: Item) -> str:
    given = (item.meta or {}).get("rubric")
    return given if isinstance(given, str) and given.strip() else DEFAULT_RUBRIC


def judge_messages(response: str, item: Item) -> list[ChatMessage]:
    question = item.question or "\n".join(f"{m.role}: {m.content}" for m in item.messages or [])
    parts = [f"Question:\n{question}"]
    if item.answer is not None:
        parts.append(f"Reference answer:\n{item.answer}")
    parts += [
        f"Response to grade:\n{clean_response(response)}",
        f"Rubric:\n{rubric_for(item)}",
        "Think briefly if you need to, then end with exactly one line: "
        "VERDICT: CORRECT or VERDICT: INCORRECT",
    ]
    return [ChatMessage("system", JUDGE_SYSTEM), ChatMessage("user", "\n\n".join(parts))]


def parse_verdict(reply: str) -> bool | None:
    """True/False from the last "VERDICT: ..." of a judge's reply (or a reply that is just
    "correct"/"incorrect"); None when there is no verdict."""
    text = clean_response(reply)
    found = _VERDICT.findall(text)
    if found:
        return str(found[-1]).lower() == "correct"
    if m := _LONE.fullmatch(text):
        return m[1].lower() == "correct"
    return None


def judge(spec: str | None = None, *, engine: Engine | None = None) -> Grader:
    """`engine` (tests) replaces loading `spec`."""
    if engine is None:
        if not spec:
            raise ValueError("the judge grader needs a model SPEC: judge:<model SPEC>")
        engine = load_engine(spec, WorkerSettings.from_env(), role="judge")
    judge_engine = engine
    # engines that batch on a device are not safe to call from several grading threads
    serial = contextlib.nullcontext() if getattr(engine, "thread_safe", False) else threading.Lock()

    def grade(response: str, item: Item) -> Grade:
        request = GenRequest(item_id=item.id, messages=judge_messages(response, item), params=JUDGE_PARAMS)
        with serial:
            (out,) = judge_engine.generate([request])
        if isinstance(out, EngineError):
            raise out
        verdict = parse_verdict(out.text)
        if verdict is None:
            detail = "no verdict from the judge: " + " ".join(out.text.split())[:MAX_DETAIL]
            return Grade(extracted=None, correct=False, score=0.0, detail=detail)
        return Grade(
            extracted="CORRECT" if verdict else "INCORRECT",
            correct=verdict,
            score=float(verdict),
            detail=" ".join(clean_response(out.text).split())[:MAX_DETAIL] or None,
        )

    return grade
