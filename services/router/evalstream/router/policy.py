"""Routing policies: which worker group gets a shard. Pure functions: no I/O, no clock.

The inputs are snapshots (`GroupView`, built by router/fleet.py from heartbeats and Kafka
consumer lag) and the shard's traits; whatever outlives one decision (the round-robin turn,
the sliding window of `AdaptiveWeights`) belongs to the caller, who also passes the time in.
Every policy considers only the *eligible* groups it is given (healthy, serving the model)
and returns None when all of them are saturated (outstanding shards ≥ ROUTER_MAX_LAG per
live member) — the two lag-aware scores also when their best group is (see below): the
caller then holds the shard (back-pressure) instead of piling it onto a full queue.

ROUTER_POLICY selects one of:

``weighted`` (default): the lowest score wins::

    score(g, s) = w_lag·L_g + w_lat·P_g + w_gpu·U_g + w_mem·π_s·M_g

    L_g = min(1, outstanding_g / capacity_g)   outstanding shards (consumer lag + shards routed
                                               since the lag was read) over the saturation
                                               bound, ROUTER_MAX_LAG × live members
    P_g = p95_g / max_h p95_h                  recent p95 latency, relative to the slowest
                                               eligible group (0 while none reports one)
    U_g = mean GPU utilisation, 0..1           CPU utilisation for members without a GPU
    M_g = used / (used + free) GPU memory      memory pressure, 0 when unknown
    π_s = min(1, prompt_tokens(s) / 2048)      the shard's mean prompt length: long prompts
                                               need KV-cache room, so memory pressure counts
                                               in proportion to it

  The weights adapt over a sliding window (60 s) of the term values seen across the fleet,
  by the entropy weight method: a term whose values barely differ between groups and over
  time cannot tell groups apart, so its weight sinks toward a floor; a term that separates
  them gains weight. With n rows (group × refresh) in the window and base weights b from
  ROUTER_WEIGHTS::

    p_ik = x_ik / Σ_i x_ik
    E_k  = −(1 / ln n) · Σ_i p_ik ln p_ik      entropy of term k, 0..1
    d_k  = 1 − E_k                             divergence: the information term k carries
    w_k  = b_k (ε + d_k) / Σ_j b_j (ε + d_j)   ε = 0.1 keeps every configured term alive

``least_outstanding``: weighted least outstanding work, i.e. the shortest expected delay
``(outstanding_g + 1) / rate_g``, where rate_g is the group's measured drain rate (shards
committed per second while it had a backlog); until every candidate has one, live members
stand in for the rate (weighted least connections).

For both, when the best group is saturated the shard waits for it instead of queueing
behind a worse group (a 4× slower group would make it, and the end of the run, later),
unless some group is idle: a healthy group never idles while shards wait.

``consistent_hash``: prefix affinity. Each group owns 64 virtual nodes on a hash ring; a
shard's key is its model and the first 256 characters of its prompt (system prompt,
template head, first item), so shards sharing a prefix land on the same group and its
prefix cache stays warm. A saturated group passes the shard clockwise to the next one
(consistent hashing with bounded loads); a dead group's arcs fall to their successors and
come back with it, moving no other keys.

``round_robin``: the load-oblivious baseline: groups in turn, saturated or not. Like every
policy it still stops (back-pressure) when all groups are saturated.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from evalstream.common.messages import Item, Shard

POLICIES = ("weighted", "least_outstanding", "consistent_hash", "round_robin")
TERMS = ("lag", "latency", "gpu", "memory")
Weights = dict[str, float]

LONG_PROMPT_TOKENS = 2048  # π reaches 1 here
CHARS_PER_TOKEN = 4  # the router has no tokenizer: a common estimate for English text
PREFIX_CHARS = 256
VNODES = 64
WEIGHT_FLOOR = 0.1  # ε
WINDOW_S = 60.0


@dataclass(frozen=True)
class GroupView:
    """What a policy knows of one eligible group at decision time."""

    name: str
    members: int  # live members
    outstanding: int  # shards routed to it and not yet committed by it
    capacity: int  # outstanding shards at which it counts as saturated
    p95_ms: float = 0.0
    utilization: float | None = None  # GPU (or CPU) utilisation 0..1
    memory_pressure: float | None = None  # used / total GPU memory 0..1
    drain_rate: float | None = None  # shards per second, measured while backlogged

    @property
    def saturated(self) -> bool:
        return self.outstanding >= self.capacity

    @property
    def load(self) -> float:
        return min(1.0, self.outstanding / self.capacity) if self.capacity > 0 else 1.0


@dataclass(frozen=True)
class ShardTraits:
    """What a policy needs to know of the shard being placed."""

    prompt_tokens: float  # mean per item, estimated
    prefix_key: str


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise ValueError(f"unknown ROUTER_POLICY {name!r} (known: {', '.join(POLICIES)})")
    return name


def parse_weights(text: str) -> Weights:
    """ "lag=0.4,latency=0.3,gpu=0.15,memory=0.15" -> weights normalised to sum 1 (a term
    left out weighs 0)."""
    raw: Weights = dict.fromkeys(TERMS, 0.0)
    for part in text.split(","):
        if not part.strip():
            continue
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in TERMS:
            raise ValueError(f"ROUTER_WEIGHTS: {part.strip()!r}: expected TERM=WEIGHT, TERM in {TERMS}")
        raw[key] = float(value)
        if raw[key] < 0 or not math.isfinite(raw[key]):
            raise ValueError(f"ROUTER_WEIGHTS: {key} must be a finite number >= 0")
    total = sum(raw.values())
    if total <= 0:
        raise ValueError("ROUTER_WEIGHTS: at least one weight must be positive")
    return {k: v / total for k, v in raw.items()}


# --------------------------------------------------------------------------- shard traits


def _item_text(item: Item) -> str:
    text = item.question or "".join(m.content for m in item.messages or ())
    return text + "".join(item.choices or ())


def traits(shard: Shard) -> ShardTraits:
    head = (shard.prompt_template or "").split("{", 1)[0]  # the template before its placeholder
    fixed = (shard.system_prompt or "") + head
    texts = [_item_text(i) for i in shard.items]
    mean_chars = len(fixed) + (sum(map(len, texts)) / len(texts) if texts else 0.0)
    first = texts[0] if texts else ""
    return ShardTraits(
        prompt_tokens=mean_chars / CHARS_PER_TOKEN,
        prefix_key=f"{shard.model}\x00{(fixed + first)[:PREFIX_CHARS]}",
    )


# --------------------------------------------------------------------------- weighted score


def terms(view: GroupView, max_p95_ms: float) -> dict[str, float]:
    return {
        "lag": view.load,
        "latency": view.p95_ms / max_p95_ms if max_p95_ms > 0 else 0.0,
        "gpu": view.utilization or 0.0,
        "memory": view.memory_pressure or 0.0,
    }


def weighted_score(view: GroupView, weights: Weights, max_p95_ms: float, prompt_tokens: float) -> float:
    x = terms(view, max_p95_ms)
    x["memory"] *= min(1.0, prompt_tokens / LONG_PROMPT_TOKENS)
    return sum(weights.get(k, 0.0) * x[k] for k in TERMS)


def entropy_weights(rows: Sequence[dict[str, float]], base: Weights, floor: float = WEIGHT_FLOOR) -> Weights:
    """The entropy weight method over `rows` (one dict of term values each), on top of `base`."""
    n = len(rows)
    raw: Weights = {}
    for k in TERMS:
        column = [max(0.0, r[k]) for r in rows]
        total = sum(column)
        divergence = 0.0
        if n >= 2 and total > 0:
            entropy = -sum(p * math.log(p) for p in (c / total for c in column) if p > 0) / math.log(n)
            divergence = max(0.0, 1.0 - entropy)
        raw[k] = base.get(k, 0.0) * (floor + divergence)
    total = sum(raw.values())
    return {k: v / total for k, v in raw.items()} if total > 0 else dict(base)


class AdaptiveWeights:
    """The weights of the weighted score, adapted over a sliding window of observations."""

    def __init__(self, base: Weights, window_s: float = WINDOW_S, max_rows: int = 4096) -> None:
        self.base = base
        self.window_s = window_s
        self._rows: deque[tuple[float, dict[str, float]]] = deque(maxlen=max_rows)
        self.current: Weights = entropy_weights([], base)

    def observe(self, now: float, views: Iterable[GroupView]) -> Weights:
        views = list(views)
        max_p95 = max((v.p95_ms for v in views), default=0.0)
        self._rows.extend((now, terms(v, max_p95)) for v in views)
        while self._rows and self._rows[0][0] < now - self.window_s:
            self._rows.popleft()
        self.current = entropy_weights([r for _, r in self._rows], self.base)
        return self.current


# --------------------------------------------------------------------------- policies


def _open(views: Sequence[GroupView]) -> list[GroupView]:
    return [v for v in views if not v.saturated]


def _best_or_wait(ranked: list[GroupView]) -> GroupView | None:
    """The best-ranked group; if it is saturated, the shard waits for it rather than queue
    behind a worse group, unless a group sits idle (a healthy group never idles while
    shards wait). None: wait."""
    if not ranked:
        return None
    if not ranked[0].saturated:
        return ranked[0]
    return next((v for v in ranked if v.outstanding == 0 and not v.saturated), None)


def pick_weighted(views: Sequence[GroupView], weights: Weights, prompt_tokens: float) -> GroupView | None:
    max_p95 = max((v.p95_ms for v in views), default=0.0)
    return _best_or_wait(
        sorted(views, key=lambda v: (weighted_score(v, weights, max_p95, prompt_tokens), v.load, v.name))
    )


def expected_delay(view: GroupView, use_rate: bool) -> float:
    """Seconds (or, without measured rates, shards per member) until a new shard is done."""
    rate = view.drain_rate if use_rate and view.drain_rate else float(max(1, view.members))
    return (view.outstanding + 1) / rate


def pick_least_outstanding(views: Sequence[GroupView]) -> GroupView | None:
    use_rate = all(v.drain_rate for v in views)
    return _best_or_wait(sorted(views, key=lambda v: (expected_delay(v, use_rate), v.outstanding, v.name)))


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@functools.lru_cache(maxsize=256)
def ring(names: tuple[str, ...], vnodes: int = VNODES) -> tuple[tuple[int, str], ...]:
    """Sorted (point, group) pairs, `vnodes` per group; cached per set of groups."""
    return tuple(sorted((_point(f"{name}#{i}"), name) for name in names for i in range(vnodes)))


def pick_consistent_hash(views: Sequence[GroupView], key: str, vnodes: int = VNODES) -> GroupView | None:
    by_name = {v.name: v for v in views}
    points = ring(tuple(sorted(by_name)), vnodes)
    if not points:
        return None
    start = bisect.bisect_left(points, (_point(key), ""))
    for step in range(len(points)):
        view = by_name[points[(start + step) % len(points)][1]]
        if not view.saturated:
            return view
    return None


def pick_round_robin(views: Sequence[GroupView], turn: int) -> GroupView | None:
    if not _open(views):
        return None
    ordered = sorted(views, key=lambda v: v.name)
    return ordered[turn % len(ordered)]


def choose(
    policy: str, views: Sequence[GroupView], shard: ShardTraits, *, weights: Weights, turn: int = 0
) -> GroupView | None:
    """The group for a shard, or None when every group in `views` is saturated (or there is
    none): the caller waits."""
    if policy == "weighted":
        return pick_weighted(views, weights, shard.prompt_tokens)
    if policy == "least_outstanding":
        return pick_least_outstanding(views)
    if policy == "consistent_hash":
        return pick_consistent_hash(views, shard.prefix_key)
    if policy == "round_robin":
        return pick_round_robin(views, turn)
    raise ValueError(f"unknown policy {policy!r}")
