"""`openai:<model>@<base_url>[?options]`: any OpenAI-compatible chat-completions server
(DeepSeek, OpenAI, vLLM, SGLang, TGI, llama.cpp's server). A raw prompt (GenRequest.prompt,
lm-eval tasks) goes to the completions endpoint instead (`POST <base>/completions` with
`prompt`), continued as it is: no chat template on either side.

    openai:deepseek-chat@https://api.deepseek.com/v1?rps=5&rpm=200&concurrency=8

`<base_url>` may be a provider preset's name (libs/common/evalstream/common/providers.py):
`openai:deepseek-chat@deepseek` is DeepSeek's API with its documented limits (10 requests/s,
1,000/min, 30 s timeout, 3 retries, key in DEEPSEEK_API_KEY).

One module a job:

    config.py   the SPEC's options, the operator's defaults and WORKER_API_KEYS
    pacing.py   the adaptive concurrency limit, token buckets and the provider's limits
                learned from its x-ratelimit-* headers (pure)
    wire.py     request bodies, what they cost, and the answers read back
    engine.py   the Engine: requests on its own event loop, retries, key redaction
    scoring.py  log-likelihood scoring through the completions endpoint
"""

from __future__ import annotations

from evalstream.worker.engines.openai.config import (
    MAX_RESPONSE_BYTES,
    OpenAIConfig,
    OpenAIConfigError,
    key_variable,
    openai_config,
    parse_key_rules,
    parse_target,
)
from evalstream.worker.engines.openai.engine import OpenAIEngine
from evalstream.worker.engines.openai.pacing import (
    MAX_LEARNED_BUCKETS,
    AdaptiveLimit,
    LearnedBucket,
    LearnedLimits,
    LimitReading,
    TokenBucket,
    backoff_delay,
    parse_duration,
    rate_buckets,
    rate_limit_readings,
    retry_after_seconds,
)
from evalstream.worker.engines.openai.wire import Completion, parse_completion, request_costs

__all__ = [
    "MAX_LEARNED_BUCKETS",
    "MAX_RESPONSE_BYTES",
    "AdaptiveLimit",
    "Completion",
    "LearnedBucket",
    "LearnedLimits",
    "LimitReading",
    "OpenAIConfig",
    "OpenAIConfigError",
    "OpenAIEngine",
    "TokenBucket",
    "backoff_delay",
    "key_variable",
    "openai_config",
    "parse_completion",
    "parse_duration",
    "parse_key_rules",
    "parse_target",
    "rate_buckets",
    "rate_limit_readings",
    "request_costs",
    "retry_after_seconds",
]
