"""Turns an item into what the model sees: chat messages, or the raw question."""

from __future__ import annotations

# The default templates live in the shared library: run manifests record them.
from evalstream.common.graders import template_for
from evalstream.common.messages import ChatMessage, Item, Shard


def format_choices(choices: list[str] | None) -> str:
    return "\n".join(f"{chr(ord('A') + i)}. {c}" for i, c in enumerate(choices or []))


def build_messages(shard: Shard, item: Item, grader: str) -> list[ChatMessage]:
    """System prompt, then either the item's own conversation or the template applied to
    its question. `grader` is the one resolved for this item (never "auto")."""
    system = [ChatMessage("system", shard.system_prompt)] if shard.system_prompt else []
    if item.messages:
        return [*system, *item.messages]
    template = template_for(grader, shard.prompt_template)
    text = template.replace("{question}", item.question or "").replace("{prompt}", item.question or "")
    if "{choices}" in text:
        text = text.replace("{choices}", format_choices(item.choices))
    return [*system, ChatMessage("user", text)]


def raw_prompt(item: Item) -> str:
    """The prompt of an item of a raw-prompt shard (Shard.raw_prompt): its question exactly,
    with no system prompt, template or chat template, as lm-eval sends a task's context.
    Raises ValueError for an item without one (a conversation has no raw form)."""
    if item.question is None:
        raise ValueError(
            f"item {item.id}: a raw prompt is the item's question, and it has none (messages only)"
        )
    return item.question
