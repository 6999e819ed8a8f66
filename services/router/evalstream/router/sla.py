"""SLA fallback, for runs that opt in (JobSpec/Shard.sla_fallback). Pure: no I/O, no clock.

The SLA violation rate of a model over the last 60 s::

    rate = 0.7 · latency_violations / samples + 0.3 · error_violations / samples

A sample is one heartbeat of a member of a group serving the model: it carries the member's
recent p95 latency and error rate. It is a latency violation when p95 > ROUTER_SLA_P95_MS,
an error violation when the error rate > ROUTER_SLA_MAX_ERROR_RATE. No samples, no violation.

ROUTER_SLA_TIERS lists ascending rates, e.g. "0.3,0.6"; the tier is how many of them the
rate reaches. ROUTER_FALLBACK maps each model to a lighter one, e.g.
"hf:big=hf:medium,hf:medium=hf:small", which makes the chain hf:big → hf:medium → hf:small.
At tier k, new shards of opted-in runs go to the model k steps down the chain (its last
model if the chain is shorter). Where that model has no healthy group, the lighter ones
are tried, then the heavier ones back to the requested model. Runs that do not opt in,
and runs pinned to a group, always get the requested model.

The window is the damping: a group relieved of the opted-in runs' load recovers, its
samples age out, and shards return to the requested model within about a minute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

LATENCY_SHARE = 0.7
ERROR_SHARE = 0.3
WINDOW_S = 60.0


@dataclass(frozen=True)
class Sample:
    ts: float
    group: str
    p95_ms: float
    error_rate: float


def violation_rate(samples: list[Sample], p95_limit_ms: float, max_error_rate: float) -> float:
    if not samples:
        return 0.0
    latency = sum(s.p95_ms > p95_limit_ms for s in samples) / len(samples)
    errors = sum(s.error_rate > max_error_rate for s in samples) / len(samples)
    return LATENCY_SHARE * latency + ERROR_SHARE * errors


def parse_tiers(text: str) -> list[float]:
    tiers = [float(t) for t in text.split(",") if t.strip()]
    if tiers != sorted(set(tiers)) or any(not 0 < t <= 1 for t in tiers):
        raise ValueError(f"ROUTER_SLA_TIERS {text!r}: expected ascending rates in (0, 1]")
    return tiers


def tier(rate: float, thresholds: list[float]) -> int:
    return sum(rate >= t for t in thresholds)


def parse_fallback(text: str) -> dict[str, str]:
    """ "hf:big=hf:medium,hf:medium=hf:small" -> {model: lighter model}. A SPEC has no ","
    (WORKER_MODEL lists them with it); the first "=" separates the pair."""
    mapping: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        heavy, eq, light = (s.strip() for s in part.partition("="))
        if not eq or not heavy or not light or heavy == light:
            raise ValueError(f"ROUTER_FALLBACK: {part.strip()!r}: expected MODEL=LIGHTER_MODEL")
        if heavy in mapping:
            raise ValueError(f"ROUTER_FALLBACK: {heavy!r} has two fallbacks")
        mapping[heavy] = light
    return mapping


def chain(model: str, mapping: dict[str, str]) -> list[str]:
    """`model` and its ever lighter fallbacks (a cycle in the mapping ends the chain)."""
    out = [model]
    while (nxt := mapping.get(out[-1])) is not None and nxt not in out:
        out.append(nxt)
    return out


def candidates(model: str, mapping: dict[str, str], level: int) -> list[str]:
    """Models to try, in order, at tier `level`: the tier's model, lighter ones, heavier ones."""
    models = chain(model, mapping)
    k = min(level, len(models) - 1)
    return models[k:] + models[:k][::-1]


class SlaWindow:
    """The last 60 s of heartbeat samples, from which each model's violation rate is read."""

    def __init__(self, window_s: float = WINDOW_S, max_samples: int = 20_000) -> None:
        self.window_s = window_s
        self._samples: deque[Sample] = deque(maxlen=max_samples)

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)

    def rate(
        self, serves_model: Callable[[str], bool], now: float, p95_limit_ms: float, max_error_rate: float
    ) -> float:
        """The violation rate of the groups for which `serves_model(group)` holds."""
        while self._samples and self._samples[0].ts < now - self.window_s:
            self._samples.popleft()
        recent = [s for s in self._samples if s.ts <= now and serves_model(s.group)]
        return violation_rate(recent, p95_limit_ms, max_error_rate)
