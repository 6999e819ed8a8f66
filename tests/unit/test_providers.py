"""Provider presets: `openai:<model>@deepseek` stands for DeepSeek's API with its documented
limits, SPEC options override a preset, and a misspelt preset is refused everywhere a SPEC
is checked."""

from __future__ import annotations

import pytest

from evalstream.common import providers
from evalstream.common.specs import spec_problem
from evalstream.worker.engines import validate_spec
from evalstream.worker.engines.openai import OpenAIConfigError, parse_target, rate_buckets


def test_deepseek_preset_is_the_seeds_api_and_limits() -> None:
    c = parse_target("deepseek-chat@deepseek", {})
    assert (c.model, c.base_url) == ("deepseek-chat", "https://api.deepseek.com/v1")
    assert (c.rps, c.rpm, c.timeout_s, c.max_retries) == (10.0, 1000.0, 30.0, 3)
    assert c.key_env == "DEEPSEEK_API_KEY"
    # the same endpoint as written out in full: one revision, one answer-cache key space
    full = parse_target("deepseek-chat@https://api.deepseek.com/v1?rps=10&rpm=1000&timeout=30&retries=3", {})
    assert (full.base_url, full.rps, full.rpm, full.timeout_s, full.max_retries) == (
        c.base_url,
        c.rps,
        c.rpm,
        c.timeout_s,
        c.max_retries,
    )


def test_spec_options_override_the_preset_and_the_preset_overrides_the_environment() -> None:
    env = {"OPENAI_RPS": "50", "OPENAI_TIMEOUT_S": "120", "OPENAI_MAX_RETRIES": "9"}
    c = parse_target("deepseek-reasoner@deepseek?rps=5&retries=1", env)
    assert (c.rps, c.max_retries) == (5.0, 1)  # written in the SPEC
    assert (c.rpm, c.timeout_s) == (1000.0, 30.0)  # the preset's, not the worker's defaults
    assert parse_target("m@http://127.0.0.1:8000/v1", env).rps == 50.0  # no preset: environment


def test_the_preset_limits_pace_requests_within_the_providers_quota() -> None:
    """1,200 requests wanted at once: start times the token buckets hand out (virtual time)
    keep to 10 per second (plus the one-second burst) and 1,000 per minute."""
    c = parse_target("deepseek-chat@deepseek", {})
    buckets = rate_buckets(c.rps, c.rpm, now=0.0)
    starts = [max(b.reserve(0.0) for b in buckets) for _ in range(1200)]
    assert max(sum(1 for s in starts if t <= s < t + 1) for t in range(0, 120)) <= 2 * c.rps
    assert sum(1 for s in starts if s < 60) <= c.rpm
    assert starts[-1] >= (1200 - c.rps) / c.rps - 1e-9


@pytest.mark.parametrize("spec", ["openai:deepseek-chat@deepsek", "openai:deepseek-chat@deepsek?rps=1"])
def test_an_unknown_preset_is_refused_with_the_known_ones_named(spec: str) -> None:
    for problem in (spec_problem(spec), validate_spec(spec)):
        assert (
            problem is not None and "'deepsek'" in problem and "deepseek" in problem.replace("'deepsek'", "")
        )
    with pytest.raises(OpenAIConfigError):
        parse_target(spec.removeprefix("openai:"), {})


def test_presets_pass_every_spec_check() -> None:
    for name in providers.PRESETS:
        spec = f"openai:some-model@{name}"
        assert spec_problem(spec) is None and validate_spec(spec) is None
