"""Every message on the wire: versioned msgspec Structs, JSON-encoded.

JSON (not msgpack) so that any Kafka client can publish a job. Decoding is strict about
types and lenient about unknown fields, so that a newer producer can add fields without
breaking older consumers; `schema_version` changes only for incompatible changes.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec
import msgspec.inspect

from evalstream.common.jsonlimits import shape_problem
from evalstream.common.specs import DEFAULT_MODEL

SCHEMA_VERSION = 1


class GenerationParams(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = msgspec.field(default_factory=list)

    def problems(self) -> list[str]:
        out = []
        if not 1 <= self.max_tokens <= 32768:
            out.append(f"max_tokens must be in 1..32768, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 2.0:
            out.append(f"temperature must be in 0..2, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            out.append(f"top_p must be in (0, 1], got {self.top_p}")
        return out


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Per job. Retries wait on eval.retry in the router, holding that partition: the cap
    keeps one run's late retries from holding back the others' for long."""

    max_attempts: int = 3
    base_delay_s: float = 1.0
    multiplier: float = 4.0
    max_delay_s: float = 60.0

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt + 1`."""
        return float(min(self.max_delay_s, self.base_delay_s * self.multiplier ** max(0, attempt - 1)))

    def problems(self) -> list[str]:
        out = []
        if not 1 <= self.max_attempts <= 20:
            out.append(f"max_attempts must be in 1..20, got {self.max_attempts}")
        if not 0.0 <= self.base_delay_s <= 600.0:
            out.append(f"base_delay_s must be in 0..600, got {self.base_delay_s}")
        if not 1.0 <= self.multiplier <= 10.0:
            out.append(f"multiplier must be in 1..10, got {self.multiplier}")
        if not 0.0 <= self.max_delay_s <= 600.0:
            out.append(f"max_delay_s must be in 0..600, got {self.max_delay_s}")
        return out


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str


class TaskFile(msgspec.Struct, frozen=True):
    """One file of an lm-evaluation-harness task: its path relative to the task root and its
    text, as read when the run was submitted."""

    path: str
    text: str


class TaskSource(msgspec.Struct, frozen=True, kw_only=True):
    """The lm-evaluation-harness task a run's items were rendered from (`evalctl submit
    --task`): recorded in the run manifest so that the run names exactly what produced its
    prompts. The items themselves are the run's dataset; nothing re-renders them."""

    name: str  # the task's name (lm-eval's `task`)
    files: list[TaskFile]  # the task's YAML first, then the files it includes, in order
    sha256: str  # of the files (evalstream.common.lmeval.task_sha256)
    reader: str  # the reader that rendered the items, e.g. "lm-eval-0.4.13/1"
    num_fewshot: int = 0  # as rendered (the YAML's, or an override)
    fewshot_seed: int = 1234  # the few-shot sampler's seed
    group: str | None = None  # the group YAML the task was submitted through, if any


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Published to eval.jobs by `evalctl submit` or any Kafka client."""

    dataset: str  # s3://<datasets bucket>/key, or a file under the producer's DATASET_LOCAL_ROOT
    model: str = DEFAULT_MODEL
    grader: str = "auto"
    generation: GenerationParams = msgspec.field(default_factory=GenerationParams)
    prompt_template: str | None = None
    system_prompt: str | None = None
    shard_size: int | None = None  # items per shard; None: the producer picks it from the set's size
    retry: RetryPolicy = msgspec.field(default_factory=RetryPolicy)
    name: str | None = None
    run_id: str | None = None  # given by evalctl; derived from the message otherwise
    worker_group: str | None = None  # pin the run to one worker group
    sla_fallback: bool = False
    # answers generated afresh, never read from the answer cache (`evalctl reproduce`: a
    # reproduction served from the cache would prove nothing)
    bypass_cache: bool = False
    # the lm-evaluation-harness task the dataset was rendered from (`evalctl submit --task`)
    task: TaskSource | None = None
    # the model is sent each item's `question` exactly as it is: no system prompt, no prompt
    # template, no chat template (an API model through its completions endpoint), as
    # lm-eval sends a task's contexts (`evalctl submit --task` sets it)
    raw_prompt: bool = False
    schema_version: int = SCHEMA_VERSION


class Item(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    question: str | None = None
    messages: list[ChatMessage] | None = None
    answer: str | None = None
    choices: list[str] | None = None
    category: str | None = None
    # HumanEval-style code tasks
    entry_point: str | None = None
    test: str | None = None
    meta: dict[str, Any] | None = None


class StoredAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """An answer an earlier run recorded, to be graded again (a regrade): what the new result
    keeps of the original one."""

    item_id: str
    response: str
    latency_ms: float = 0.0
    cache_hit: bool = False
    served_by: str = ""
    model_revision: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: bool = False
    attempts: int = 1
    prompt: str | None = None


class Shard(msgspec.Struct, frozen=True, kw_only=True):
    """A slice of a run. Published to eval.shards (by the producer, or by the aggregator for a
    regrade), eval.work.<group> (by the router) and eval.retry (by workers, with only the
    items still to do)."""

    run_id: str
    shard_id: str
    shard_index: int
    shard_count: int
    model: str
    grader: str
    generation: GenerationParams
    items: list[Item]
    prompt_template: str | None = None
    system_prompt: str | None = None
    retry: RetryPolicy = msgspec.field(default_factory=RetryPolicy)
    attempt: int = 1
    not_before: float = 0.0  # unix time; set on eval.retry
    parked_at: float = 0.0  # unix time the router first found no healthy group for it
    worker_group: str | None = None  # pinned by the job, else chosen by the router
    routed_to: str | None = None  # worker group chosen by the router
    served_model: str | None = None  # model of that group, when it differs (SLA fallback)
    sla_fallback: bool = False
    bypass_cache: bool = False  # from the job
    # A regrade's shard: the items' recorded answers, graded again with no engine call
    # (None: a shard to answer). An item without one here fails.
    answers: list[StoredAnswer] | None = None
    raw_prompt: bool = False  # from the job: the question as the whole prompt, no template
    schema_version: int = SCHEMA_VERSION


class ItemResult(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    item_id: str
    shard_id: str
    response: str | None
    extracted: str | None
    correct: bool | None
    score: float
    error: str | None = None
    attempts: int = 1
    cache_hit: bool = False
    latency_ms: float = 0.0
    served_by: str = ""  # "<group>/<model>"
    model_revision: str = ""  # the engine's revision (weights/file hash) that produced the answer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated: bool = False
    category: str | None = None
    # What a reader needs to judge the item (bounded by evalstream.common.evidence):
    question: str | None = None
    gold: str | None = None
    prompt: str | None = None  # as rendered for the engine
    detail: str | None = None  # the grader's reason (why wrong, how matched)
    evidence: str | None = None  # what the grader saw run (a code test's output)
    # Log-likelihood scoring (graders `loglikelihood` and `perplexity`, evalstream.common.scoring;
    # None for generated answers). The engine's per-choice log-likelihoods are the response
    # (JSON), the grader's reading of them the evidence (JSON).
    # acc_norm: the choice of highest log-likelihood per character is the gold one
    correct_norm: bool | None = None
    # of the gold continuation (loglikelihood), of the document (perplexity)
    loglikelihood: float | None = None
    # perplexity: the document's words and UTF-8 bytes (lm-eval's weights)
    doc_words: int | None = None
    doc_bytes: int | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


class ShardResult(msgspec.Struct, frozen=True, kw_only=True):
    """Published to eval.results: the items of one shard delivery that reached an outcome."""

    run_id: str
    shard_id: str
    worker_id: str
    group: str
    results: list[ItemResult]
    schema_version: int = SCHEMA_VERSION


WorkerStatus = Literal["starting", "ready", "draining", "stopped"]


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """Published to the compacted eval.heartbeats topic, keyed by worker_id."""

    worker_id: str
    group: str
    model: str
    ts: float
    device: str  # "cuda:0 (NVIDIA H100 ...)" or "cpu"
    gpu_utilization: float | None = None  # 0..1
    gpu_memory_used_bytes: int | None = None
    gpu_memory_free_bytes: int | None = None
    gpu_temperature_c: float | None = None
    gpu_power_w: float | None = None
    cpu_utilization: float | None = None
    queue_depth: int = 0
    latency_p50_ms: float = 0.0
    latency_p95_ms: float = 0.0
    tokens_per_s: float = 0.0
    error_rate: float = 0.0
    status: WorkerStatus = "ready"
    schema_version: int = SCHEMA_VERSION


class Redrive(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="redrive"):
    """Published to eval.control by `evalctl dlq redrive RUN`: the aggregator, which owns the
    dead letters, puts the run's dead-lettered items back on eval.shards with fresh attempts
    and marks the letters redriven (evalctl writes no table itself)."""

    run_id: str
    schema_version: int = SCHEMA_VERSION


class Regrade(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="regrade"):
    """Published to eval.control by `evalctl regrade RUN --grader SPEC`: the aggregator makes
    run `new_run_id` from completed run `run_id`'s recorded answers, graded again with
    `grader` by a worker group (`worker_group`, else the original's pin, else the router's
    choice for the run's model), with no model call. Its failed items stay failed. Acting on
    a request again (a redelivery) adds nothing."""

    run_id: str  # the original
    new_run_id: str
    grader: str
    worker_group: str | None = None
    schema_version: int = SCHEMA_VERSION


ControlRequest = Redrive | Regrade  # what eval.control carries, told apart by `kind`


class DeadLetterHeaders:
    """Header names on eval.dlq. The value is the original message (or, for an item that
    failed every attempt, a Shard holding only that item)."""

    ORIGINAL_TOPIC = "x-original-topic"
    ORIGINAL_PARTITION = "x-original-partition"
    ORIGINAL_OFFSET = "x-original-offset"
    ERROR = "x-error"
    ERROR_TYPE = "x-error-type"
    ATTEMPTS = "x-attempts"
    RUN_ID = "x-run-id"
    ITEM_ID = "x-item-id"
    FAILED_AT = "x-failed-at"


T = TypeVar("T")

_decoders: dict[type, tuple[msgspec.json.Decoder[Any], bool]] = {}  # kind -> (decoder, any shape)
_encoder = msgspec.json.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


# Kafka's default limit (broker message.max.bytes, producer max.request.size): nothing larger
# is ours. Messages we build are kept under MESSAGE_BUDGET_BYTES: shards are cut by size as
# well as by count, and a worker splits a large result into several messages.
MAX_MESSAGE_BYTES = 1024 * 1024
MESSAGE_BUDGET_BYTES = 900_000


def holds_any_shape(kind: Any) -> bool:
    """Whether a value of `kind` can keep JSON of any shape: a field typed Any, or a type
    that holds itself. Only such a type needs the depth check before parsing. A fixed type
    refuses a nested value where it expects another (a ValidationError at once), and the
    value of an unknown field is skipped, not kept, by a recursion that stops at Python's
    recursion limit (a RecursionError, refused in `decode`)."""

    def walk(t: msgspec.inspect.Type, structs: frozenset[type]) -> bool:
        if isinstance(t, msgspec.inspect.AnyType):
            return True
        if isinstance(t, msgspec.inspect.StructType):
            return t.cls in structs or any(walk(f.type, structs | {t.cls}) for f in t.fields)
        inner = [getattr(t, a) for a in ("item_type", "key_type", "value_type") if hasattr(t, a)]
        inner += [*getattr(t, "item_types", ()), *getattr(t, "types", ())]
        return any(walk(i, structs) for i in inner)

    return walk(msgspec.inspect.type_info(kind), frozenset())


def decode(data: bytes | str, kind: type[T], max_bytes: int = MAX_MESSAGE_BYTES) -> T:
    """Decodes `data` as `kind`; raises msgspec.ValidationError / DecodeError on bad input,
    including input too large or nested too deep to parse (checked before parsing where
    `kind` can keep any shape, else refused by the parse itself)."""
    decoder, any_shape = _decoders.get(kind) or _decoders.setdefault(
        kind, (msgspec.json.Decoder(kind), holds_any_shape(kind))
    )
    if any_shape:
        problem = shape_problem(data, max_bytes)
    else:
        size = len(data.encode() if isinstance(data, str) else data)
        problem = f"{size} bytes, over the {max_bytes}-byte limit" if size > max_bytes else None
    if problem:
        raise msgspec.DecodeError(f"not decoded: {problem}")
    try:
        result: T = decoder.decode(data)
    except RecursionError:  # an unknown field's value, nested past the recursion limit
        raise msgspec.DecodeError("not decoded: nested too deep") from None
    version = getattr(result, "schema_version", SCHEMA_VERSION)
    if version > SCHEMA_VERSION:
        raise msgspec.ValidationError(
            f"schema_version {version} is newer than this service understands ({SCHEMA_VERSION})"
        )
    return result
