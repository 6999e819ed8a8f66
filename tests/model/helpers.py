"""What the model tests of both engines ask (tests/model): the questions, and requests and
outputs in the engines' own types."""

from __future__ import annotations

from collections.abc import Sequence

from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.worker.engines import GenOutput, GenRequest

QUESTIONS = [
    "What is the capital of France?",
    "What is 12*12?",
    "Write a python function that adds two numbers.",
    "Name three colors.",
    "Who wrote Hamlet?",
    "Explain photosynthesis in one sentence.",
    "List the planets of the solar system in order from the sun, and tell me which one is the "
    "largest and why it is so much bigger than the others.",
    "Write a SQL query that selects all rows from a table named users where age is greater than 30.",
    "Is a tomato a fruit or a vegetable? Answer briefly.",
    "Summarise the plot of Romeo and Juliet in two sentences, naming the families and the ending.",
    "What does CPU stand for?",
    "Give me a haiku about autumn leaves falling gently on the ground.",
]


def ask(item_id: str, question: str, **params: object) -> GenRequest:
    return GenRequest(item_id, [ChatMessage("user", question)], GenerationParams(**params))  # type: ignore[arg-type]


def answers(outs: Sequence[object]) -> list[GenOutput]:
    checked = [o for o in outs if isinstance(o, GenOutput)]
    assert len(checked) == len(outs), outs
    return checked
