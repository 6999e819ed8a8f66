"""Provider presets: the name of an OpenAI-compatible API standing for its base URL and its
documented limits, so that a model SPEC can say `openai:deepseek-chat@deepseek` instead of
`openai:deepseek-chat@https://api.deepseek.com/v1?rps=10&rpm=1000&timeout=30&retries=3`.

Data only: the SPEC parsers (the producer's check in specs.py, the worker's openai engine)
consult `expand_endpoint`. Options in the SPEC's query override the preset's
(`openai:deepseek-chat@deepseek?rps=5` for an account with a lower limit); the preset's
override the worker's OPENAI_* variables, which are defaults for every provider.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ProviderPreset:
    base_url: str  # up to and including the API version
    rps: float  # requests per second
    rpm: float  # requests per minute
    timeout_s: float  # one HTTP request, connecting to last byte
    max_retries: int  # retries of one request before the item fails (then eval.retry)
    concurrency: int  # requests in flight at most: the adaptive limit's ceiling
    key_env: str  # the variable the worker's operator puts the key in
    description: str

    def options(self) -> dict[str, float | int | str]:
        """The preset as OpenAIConfig field values."""
        return {k: v for k, v in asdict(self).items() if k not in ("base_url", "description")}


PRESETS: dict[str, ProviderPreset] = {
    # DeepSeek's chat API as the seeds use it: 10 requests/s, 1,000/min, 30 s per request,
    # 3 retries; as many requests in flight as one second's allowance.
    "deepseek": ProviderPreset(
        base_url="https://api.deepseek.com/v1",
        rps=10.0,
        rpm=1000.0,
        timeout_s=30.0,
        max_retries=3,
        concurrency=10,
        key_env="DEEPSEEK_API_KEY",
        description="DeepSeek chat API (deepseek-chat, deepseek-reasoner)",
    ),
}


def expand_endpoint(endpoint: str) -> tuple[str, ProviderPreset | None]:
    """What follows the `@` of an openai SPEC, with a preset name replaced by its base URL:
    `deepseek?rps=5` -> ("https://api.deepseek.com/v1?rps=5", PRESETS["deepseek"]); a URL
    comes back as it is, with None. Raises ValueError for anything else."""
    if endpoint.startswith(("http://", "https://")):
        return endpoint, None
    name, sep, query = endpoint.partition("?")
    preset = PRESETS.get(name)
    if preset is None:
        raise ValueError(
            f"{name!r} is neither an http(s) base url nor a provider preset (presets: {', '.join(sorted(PRESETS))})"
        )
    return preset.base_url + sep + query, preset
