"""Turns an item into the chat messages the model sees."""

from __future__ import annotations

from evalstream.common.messages import ChatMessage, Item, Shard

# Default instructions per grader: the answer must come out in a form the grader can read.
DEFAULT_TEMPLATES = {
    "numeric": "{question}\n\nWork it out, then give the final answer as a number on the last line.",
    "exact": "{question}\n\nAnswer in a few words.",
    "multiple_choice": "{question}\n\n{choices}\n\nAnswer with the letter of the correct choice.",
    "code_exec": "Complete the following Python function. Reply with the whole function in one "
    "```python code block.\n\n```python\n{question}```",
}


def format_choices(choices: list[str] | None) -> str:
    return "\n".join(f"{chr(ord('A') + i)}. {c}" for i, c in enumerate(choices or []))


def build_messages(shard: Shard, item: Item, grader: str) -> list[ChatMessage]:
    """System prompt, then either the item's own conversation or the template applied to
    its question. `grader` is the one resolved for this item (never "auto")."""
    system = [ChatMessage("system", shard.system_prompt)] if shard.system_prompt else []
    if item.messages:
        return [*system, *item.messages]
    template = shard.prompt_template or DEFAULT_TEMPLATES.get(grader, "{question}")
    text = template.replace("{question}", item.question or "").replace("{prompt}", item.question or "")
    text = text.replace("{choices}", format_choices(item.choices))
    return [*system, ChatMessage("user", text)]
