"""Items from a task config and its documents, rendered as lm-eval 0.4.13 renders its
requests without a chat template (lm_eval/api/task.py ConfigurableTask: doc_to_text,
doc_to_target, doc_to_choice, fewshot_context, build_qa_turn, construct_requests,
process_results' gold; lm_eval/api/samplers.py; lm_eval/api/utils.py Message, maybe_delimit,
requires_delimiter). The few-shot sampler is one `random.Random(seed)` drawn from in document
order, as lm-eval's evaluator seeds it (`fewshot_random_seed`, 1234 by default), so that
document i's examples depend on every earlier draw: documents are rendered in order, all of
them (a `limit` keeps the first ones, whose contexts are the same)."""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evalstream.common.lmeval.config import TaskConfig, Template
from evalstream.common.lmeval.data import Split
from evalstream.common.lmeval.errors import TaskDataError, TaskRefused
from evalstream.common.lmeval.templates import render
from evalstream.common.messages import Item

DEFAULT_FEWSHOT_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED, simple_evaluate's fewshot_random_seed
ROLLING_ANSWER = "n/a"  # a perplexity item has no gold answer; the dataset format wants one
MAX_PROBLEMS = 20


# --------------------------------------------------------------------------- lm_eval/api/utils.py


def maybe_delimit(prefix: str | None, suffix: str | None, delimiter: str = " ") -> str:
    if not prefix:
        return suffix or ""
    if not suffix:
        return prefix or ""
    return (
        prefix + delimiter + suffix if not (prefix[-1].isspace() or suffix[0].isspace()) else prefix + suffix
    )


def requires_delimiter(prefix: str, suffix: str) -> bool:
    if prefix == "":
        return False
    return not (prefix[-1].isspace() or suffix[0].isspace())


@dataclass
class Message:
    role: str
    content: str
    delimiter: str = ""

    def to_text(self) -> str:
        return self.content + self.delimiter


# --------------------------------------------------------------------------- lm_eval/api/samplers.py


class ContextSampler:
    def __init__(self, df: Sequence[dict[str, Any]] | None, seed: int | None) -> None:
        self.rnd = random.Random(seed)
        self.df: list[dict[str, Any]] = list(df or [])

    def sample(self, n: int, eval_doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        if n == 0:
            return []
        if not self.df:
            raise TaskDataError("no few-shot documents to sample from", key="num_fewshot")
        pool = list(self.df)
        if n + (1 if eval_doc else 0) > len(pool):
            raise TaskDataError(
                f"{n} few-shot examples asked, {len(pool)} documents to draw them from", key="num_fewshot"
            )
        if not eval_doc:
            res = self.rnd.sample(pool, n)
        else:
            res = [x for x in self.rnd.sample(pool, n + 1) if x != eval_doc][:n]
        if len(res) < n:  # the pool holds copies of eval_doc
            res = self.rnd.sample([x for x in pool if x != eval_doc], n)
        return res


class FirstNSampler(ContextSampler):
    def sample(self, n: int, eval_doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        pool = [x for x in self.df if x != eval_doc] if eval_doc is not None else self.df
        if n > len(pool):
            raise TaskDataError(
                f"{n} few-shot examples asked, {len(pool)} documents to take them from", key="num_fewshot"
            )
        return pool[:n]


# --------------------------------------------------------------------------- the task


@dataclass(frozen=True)
class Rendered:
    items: list[Item]
    num_fewshot: int
    notes: list[str]


class TaskRenderer:
    """One task's documents rendered (ConfigurableTask with apply_chat_template=False)."""

    def __init__(
        self,
        cfg: TaskConfig,
        splits: dict[str, Split],
        *,
        num_fewshot: int | None = None,
        seed: int | None = DEFAULT_FEWSHOT_SEED,
    ) -> None:
        self.cfg = cfg
        self.notes: list[str] = []
        eval_split = cfg.test_split if cfg.test_split is not None else cfg.validation_split
        assert eval_split is not None  # parse_task checks it
        self.eval_split = eval_split
        self.eval_docs = splits[eval_split].docs
        self.features = splits[eval_split].features
        if not self.eval_docs:
            raise TaskDataError(f"the {eval_split} split has no documents", key="test_split")
        # simple_evaluate: an override of num_fewshot, except where the task sets 0
        shots = cfg.num_fewshot
        if num_fewshot is not None:
            if shots == 0:
                self.notes.append(
                    f"{cfg.task}: num_fewshot is 0 in the task's config; the override is ignored, as lm-eval does"
                )
            else:
                shots = num_fewshot
        self.num_fewshot = shots or 0
        fs = cfg.fewshot
        fewshot_docs: list[dict[str, Any]] | None
        if fs.split is not None:  # read only when examples are drawn (load_splits)
            fewshot_docs = splits[fs.split].docs if fs.split in splits else None
        elif fs.samples is not None:
            fewshot_docs = list(fs.samples)
        else:  # Task.fewshot_docs
            fallback = cfg.training_split or cfg.validation_split or cfg.test_split
            fewshot_docs = splits[fallback].docs if fallback in splits else None
        sampler_cls = FirstNSampler if fs.sampler == "first_n" else ContextSampler
        self.sampler = sampler_cls(fewshot_docs, seed)
        # ConfigurableTask.__init__'s test of the first document
        first = self.eval_docs[0]
        if cfg.doc_to_choice is not None and isinstance(self.doc_to_text(first), int):
            raise TaskRefused(
                "renders a choice index (lm-eval's multiple-input tasks, e.g. winogrande): not supported",
                key="doc_to_text",
            )
        if isinstance(self.doc_to_target(first), list):
            raise TaskRefused("renders a list (several gold answers): not supported", key="doc_to_target")

    # -- ConfigurableTask's doc_to_* ---------------------------------------------------

    def _template(self, doc: dict[str, Any], template: str) -> str:
        return render(template, doc)

    def doc_to_text(self, doc: dict[str, Any], spec: Template = None) -> Any:
        t = spec if spec is not None else self.cfg.doc_to_text
        if isinstance(t, int):
            return t
        if isinstance(t, str):
            if t in self.features:
                return doc[t]
            text = self._template(doc, t)
            if text.isdigit() and self.cfg.doc_to_choice is not None:
                return _literal(text, "doc_to_text")
            return text
        raise TaskRefused(f"expected a template or field name, got {type(t).__name__}", key="doc_to_text")

    def doc_to_target(self, doc: dict[str, Any], spec: Template = None) -> Any:
        t = spec if spec is not None else self.cfg.doc_to_target
        if isinstance(t, int):
            return t
        if isinstance(t, str):
            if t in self.features:
                return doc[t]
            text = self._template(doc, t)
            if text.isdigit() and self.cfg.doc_to_choice is not None:
                return _literal(text, "doc_to_target")
            if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
                try:
                    return ast.literal_eval(text)
                except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
                    return text
            return text
        if isinstance(t, list):
            return t
        raise TaskRefused(
            f"expected a template, field name, index or list, got {type(t).__name__}", key="doc_to_target"
        )

    def doc_to_choice(self, doc: dict[str, Any], spec: Template = None) -> list[Any]:
        t = spec if spec is not None else self.cfg.doc_to_choice
        if isinstance(t, str):
            value = doc[t] if t in self.features else _literal(self._template(doc, t), "doc_to_choice")
        elif isinstance(t, list):
            value = t
        elif isinstance(t, dict):
            value = list(t.values())
        else:
            raise TaskRefused(
                f"expected a template, field name, list or mapping, got {type(t).__name__}",
                key="doc_to_choice",
            )
        if not isinstance(value, list | tuple):
            raise TaskDataError(f"renders {type(value).__name__}, not a list of choices", key="doc_to_choice")
        return list(value)

    def resolve_field(self, doc: dict[str, Any], field: str | None) -> Any:
        if field:
            return doc[field] if field in doc else self._template(doc, field)
        return None

    def doc_to_prefix(self, doc: dict[str, Any]) -> str | None:
        prefix = self.cfg.gen_prefix
        if prefix is None:
            return None
        return doc[prefix] if prefix in self.features else self._template(doc, prefix)

    # -- fewshot_context / build_qa_turn -------------------------------------------------

    def build_qa_turn(
        self,
        *,
        q: Any,
        c: list[Any] | None = None,
        a: Any = None,
        gen_prefix: str | None = None,
        tgt_delim: str = " ",
        few_delim: str = "\n\n",
    ) -> list[Message]:
        if not isinstance(q, str):
            raise TaskDataError(f"the context is not a string: {q!r}"[:200], key="doc_to_text")
        has_answer = a is not None and a != ""
        user_delim = (
            tgt_delim
            if has_answer and not gen_prefix
            else tgt_delim
            if gen_prefix and requires_delimiter(q, gen_prefix)
            else ""
        )
        msgs = [Message("user", q, user_delim)]
        if has_answer:
            if c and isinstance(a, int):
                if not -len(c) <= a < len(c):
                    raise TaskDataError(f"answer index {a} of {len(c)} choices", key="doc_to_target")
                answer = c[a]
            elif isinstance(a, list):
                answer = a[0]
            else:
                answer = a
            if not isinstance(answer, str):
                raise TaskDataError(f"the answer is not a string: {answer!r}"[:200], key="doc_to_target")
            msgs.append(Message("assistant", maybe_delimit(gen_prefix, answer, " "), few_delim))
        elif gen_prefix:
            msgs.append(Message("assistant", gen_prefix))
        return msgs

    def fewshot_context(self, doc: dict[str, Any], gen_prefix: str | None) -> str:
        cfg, fs = self.cfg, self.cfg.fewshot
        messages: list[Message] = []
        description = self.resolve_field(doc, cfg.description) or ""
        system_prompt = maybe_delimit(None, description, cfg.fewshot_delimiter)
        if system_prompt:
            messages.append(Message("system", system_prompt))
        if self.num_fewshot > 0:
            eval_doc = doc if fs.split == cfg.test_split else None
            for fs_doc in self.sampler.sample(self.num_fewshot, eval_doc):
                q = self.doc_to_text(fs_doc, fs.doc_to_text)
                c = self.doc_to_choice(fs_doc, fs.doc_to_choice) if fs.doc_to_choice else None
                a = self.doc_to_target(fs_doc, fs.doc_to_target)
                messages += self.build_qa_turn(
                    q=q,
                    c=c,
                    a=a,
                    gen_prefix=self.resolve_field(fs_doc, fs.gen_prefix),
                    tgt_delim=fs.target_delimiter,
                    few_delim=fs.fewshot_delimiter,
                )
        q = self.doc_to_text(doc)
        c = self.doc_to_choice(doc) if cfg.doc_to_choice else None
        messages += self.build_qa_turn(
            q=q, c=c, gen_prefix=gen_prefix, tgt_delim=cfg.target_delimiter, few_delim=""
        )
        return "".join(m.to_text() for m in messages)

    # -- items -------------------------------------------------------------------------

    def meta(self, **extra: Any) -> dict[str, Any]:
        return {
            "lm_eval": {
                "target_delimiter": self.cfg.target_delimiter,
                "output_type": self.cfg.output_type,
                "task": self.cfg.task,
                **extra,
            }
        }

    def item(self, doc_id: int, doc: dict[str, Any]) -> Item:
        cfg = self.cfg
        ctx = self.fewshot_context(doc, self.doc_to_prefix(doc))
        target = self.doc_to_target(doc)
        if cfg.output_type == "multiple_choice":
            choices = self.doc_to_choice(doc)
            if not all(isinstance(ch, str) for ch in choices):
                raise TaskDataError("choices must be strings", key="doc_to_choice")
            index = _gold_index(target, choices)
            return Item(id=str(doc_id), question=ctx, choices=choices, answer=str(index), meta=self.meta())
        if cfg.output_type == "loglikelihood":
            if not isinstance(target, str) or not target:
                raise TaskDataError(
                    f"the continuation must be a non-empty string, got {target!r}"[:200], key="doc_to_target"
                )
            # lm-eval scores (ctx, target): no target delimiter is inserted for this output type
            meta = self.meta()
            meta["lm_eval"]["target_delimiter"] = ""
            return Item(id=str(doc_id), question=ctx, choices=[target], answer="0", meta=meta)
        if cfg.output_type == "loglikelihood_rolling":
            if not isinstance(target, str) or not target:
                raise TaskDataError(
                    f"the document must be a non-empty string, got {target!r}"[:200], key="doc_to_target"
                )
            return Item(id=str(doc_id), question=target, answer=ROLLING_ANSWER, meta=self.meta())
        # generate_until: process_results' gold
        if cfg.doc_to_choice is not None:
            choices = self.doc_to_choice(doc)
            if not isinstance(target, int) or not -len(choices) <= target < len(choices):
                raise TaskDataError(
                    f"target {target!r} is not an index of {len(choices)} choices", key="doc_to_target"
                )
            target = choices[target]
        gold = str(target)
        filters = [f.as_dict() for f in cfg.filters]
        metric = next(
            (m.as_dict() for m in cfg.metrics if m.name == "exact_match"), {"metric": "exact_match"}
        )
        return Item(id=str(doc_id), question=ctx, answer=gold, meta=self.meta(filters=filters, metric=metric))

    def render(self, limit: int | None = None) -> Rendered:
        items: list[Item] = []
        problems: list[str] = []
        docs = self.eval_docs if limit is None else self.eval_docs[:limit]
        for doc_id, doc in enumerate(docs):
            try:
                items.append(self.item(doc_id, doc))
            except TaskDataError as exc:
                if exc.key == "num_fewshot":  # the task's, not the document's
                    raise
                exc.where = exc.where or f"document {doc_id}"
                problems.append(str(exc))
                if len(problems) >= MAX_PROBLEMS:
                    break
        if problems:
            more = " (first ones)" if len(problems) >= MAX_PROBLEMS else ""
            raise TaskDataError(
                f"{len(problems)} documents do not render{more}:\n  " + "\n  ".join(problems),
                where=self.cfg.task,
            )
        return Rendered(items, self.num_fewshot, self.notes)


def _literal(text: str, key: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise TaskDataError(f"renders {text[:120]!r}, not a Python literal: {exc}", key=key) from None


def _gold_index(gold: Any, choices: list[str]) -> int:
    """process_results' gold for a multiple_choice document (lm-eval scores an index out of
    range, -100, as always wrong; here it is an error in the data)."""
    if isinstance(gold, bool) or not isinstance(gold, int | str):
        raise TaskDataError(f"gold {gold!r} is neither an index nor a choice", key="doc_to_target")
    if isinstance(gold, int):
        if not 0 <= gold < len(choices):
            raise TaskDataError(
                f"gold index {gold} is not one of {len(choices)} choices", key="doc_to_target"
            )
        return gold
    if gold not in choices:
        raise TaskDataError(f"gold {gold[:80]!r} is not one of the choices", key="doc_to_target")
    return choices.index(gold)
