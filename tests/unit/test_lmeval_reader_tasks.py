"""The lm-eval task reader (evalstream.common.lmeval) on whole tasks: lm-eval 0.4.13's own task
YAMLs render to exactly the requests lm-eval builds (recorded from lm-eval itself in
tests/lmeval_tasks/expected.json; tests/unit/test_lmeval_fidelity.py compares live), or are
refused by name where they run Python; a hostile YAML reads nothing outside its folder and
runs no code; lm-eval's filters; the job and the manifest that record the task. Each key on
its own: tests/unit/test_lmeval_reader_keys.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from evalstream.common.lmeval import TaskDataError, TaskError, TaskRefused, read_tasks
from evalstream.common.lmeval.isolation import read_tasks_isolated
from evalstream.common.lmeval.submission import dataset_bytes, task_job
from evalstream.common.lmeval.templates import render
from evalstream.common.lmeval_filters import apply_pipeline, exact_match, grade, regex_filter
from evalstream.common.manifest import build_manifest, manifest_sha256, request_from_manifest
from evalstream.common.messages import JobSpec
from tests.lmeval_tasks import fidelity
from tests.unit.lmeval_task_files import BASE, lm, q, rows, write

# --------------------------------------------------------------------------- lm-eval's own YAMLs


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fidelity.EXPECTED.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("name", list(fidelity.TASKS))
def test_lm_evals_own_yamls_render_as_lm_eval_recorded(name: str, expected: dict[str, Any]) -> None:
    path, shots = fidelity.TASKS[name]
    [task] = read_tasks(
        fidelity.TASKS_DIR / path, root=fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, num_fewshot=shots
    )
    canonical = fidelity.canonical_from_items(task)
    want = expected[name]
    assert canonical[:2] == want["first"]  # the strings themselves, byte for byte
    assert len(canonical) == want["docs"]
    assert fidelity.digest(canonical) == want["sha256"]
    assert [item.id for item in task.items] == [str(i) for i in range(want["docs"])]  # lm-eval's doc_id


@pytest.mark.parametrize("group", list(fidelity.GROUPS))
def test_a_group_renders_as_lm_eval_recorded(group: str, expected: dict[str, Any]) -> None:
    tasks = read_tasks(fidelity.TASKS_DIR / fidelity.GROUPS[group], data_dir=fidelity.DATA_DIR)
    got = {t.name: fidelity.digest(fidelity.canonical_from_items(t)) for t in tasks}
    assert got == expected[f"group:{group}"]
    assert {t.source.group for t in tasks} == {group}


def test_the_recorded_strings_are_what_lm_eval_shows() -> None:
    """A few literal pieces of lm-eval's contexts, so that a wrong recording cannot pass."""
    tasks = {
        name: read_tasks(
            fidelity.TASKS_DIR / path, root=fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, num_fewshot=shots
        )[0]
        for name, (path, shots) in fidelity.TASKS.items()
    }
    gsm = tasks["gsm8k"].items[0]
    assert q(gsm).startswith("Question: ")
    assert q(gsm).count("\n\nQuestion: ") == 5  # 5 examples, fewshot_delimiter "\n\n"
    assert q(gsm).endswith(
        "Question: Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and "
        "bakes muffins for her friends every day with four. She sells the remainder at the farmers' "
        "market daily for $2 per fresh duck egg. How much in dollars does she make every day at the "
        "farmers' market?\nAnswer:"
    )
    assert gsm.answer is not None and gsm.answer.endswith("#### 18")
    mmlu = tasks["mmlu_college_physics"].items[0]
    assert q(mmlu).startswith(
        "The following are multiple choice questions (with answers) about college physics.\n\n"
    )
    assert mmlu.choices == ["A", "B", "C", "D"] and q(mmlu).endswith("\nAnswer:")
    assert q(mmlu).count("\nAnswer: ") == 5  # first_n: the 5 dev questions, each answered
    nav = tasks["bbh_zeroshot_navigate"]
    assert nav.source.num_fewshot == 0
    [zero] = read_tasks(
        fidelity.TASKS_DIR / "bbh/zeroshot/navigate.yaml",
        data_dir=fidelity.DATA_DIR,
        root=fidelity.TASKS_DIR,
        num_fewshot=3,
    )
    assert zero.source.num_fewshot == 0 and any("num_fewshot is 0" in n for n in zero.notes)  # as lm-eval
    assert q(nav.items[0]).startswith(
        "Given a series of navigation instructions, determine whether one would end up back at the "
        "starting point.\n\nQ: If you follow these instructions"
    )
    lam = tasks["lambada_openai"].items[0]
    first = json.loads(
        (fidelity.DATA_DIR / "EleutherAI/lambada_openai/default/test.jsonl").read_text().splitlines()[0]
    )
    assert lam.choices is not None and q(lam) + lam.choices[0] == first["text"]
    assert lam.meta == {
        "lm_eval": {"target_delimiter": "", "output_type": "loglikelihood", "task": "lambada_openai"}
    }


def test_a_folder_is_every_task_in_it_and_items_load_as_a_dataset() -> None:
    from evalstream.common.datasets import load_dataset

    tasks = read_tasks(fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR)
    assert sorted(t.name for t in tasks) == sorted(fidelity.TASKS)
    for t in tasks:
        loaded = load_dataset(dataset_bytes(t.items), f"{t.name}.jsonl")
        assert loaded.items == t.items


def test_item_format_per_output_type() -> None:
    tasks = {t.name: t for t in read_tasks(fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, limit=3)}
    mc = tasks["arc_easy"].items[0]
    assert tasks["arc_easy"].grader == "loglikelihood"
    assert mc.meta == {
        "lm_eval": {"target_delimiter": " ", "output_type": "multiple_choice", "task": "arc_easy"}
    }
    assert mc.choices is not None and mc.answer is not None and 0 <= int(mc.answer) < len(mc.choices)
    assert not any(c.startswith(" ") for c in mc.choices)  # continuations without the delimiter
    roll = tasks["pile_10k"]
    assert roll.grader == "perplexity" and lm(roll.items[0])["output_type"] == "loglikelihood_rolling"
    assert q(roll.items[0]).startswith("The four matrices W, X, Y, Z")
    gen = tasks["gsm8k"]
    assert gen.grader == "lm_eval"
    assert gen.generation is not None and gen.generation.stop == ["Question:", "</s>", "<|im_end|>"]
    assert gen.generation.max_tokens == 256 and gen.generation.temperature == 0.0
    meta = lm(gen.items[0])
    assert [f["name"] for f in meta["filters"]] == ["strict-match", "flexible-extract"]
    assert meta["metric"]["regexes_to_ignore"] == [",", "\\$", "(?s).*#### ", "\\.$"]
    assert [len(t.items) for t in tasks.values()] == [3] * len(tasks)


# --------------------------------------------------------------------------- refusals


def test_lm_evals_yamls_with_python_are_refused_naming_the_key() -> None:
    refused = fidelity.HERE / "refused"
    cases = {
        "wikitext/wikitext.yaml": "doc_to_target",
        "bigbench/multiple_choice/date_understanding.yaml": "process_docs",  # from its include
        "bbh/zeroshot/sports_understanding.yaml": "filter_list[1].filter[0].function",
    }
    for path, key in cases.items():
        with pytest.raises(TaskRefused) as info:
            read_tasks(refused / path, root=refused, data_dir=fidelity.DATA_DIR)
        assert info.value.key == key, str(info.value)


def test_files_outside_the_task_root_are_not_read(tmp_path: Path) -> None:
    task_dir = tmp_path / "tasks"
    write(tmp_path, {"secret.yaml": "task: secret\n", "secret.jsonl": rows(1)})
    for yaml in (
        "include: ../secret.yaml\n",
        f"include: {tmp_path / 'secret.yaml'}\n",
        "task: t\ndataset_path: json\ndataset_kwargs: {data_files: ../secret.jsonl}\ntest_split: train\ndoc_to_text: q\ndoc_to_target: a\n",
        "task: t\ndataset_path: json\ndataset_kwargs: {data_files: /etc/passwd}\ntest_split: train\ndoc_to_text: q\ndoc_to_target: a\n",
    ):
        write(task_dir, {"t.yaml": yaml})
        with pytest.raises(TaskRefused, match="outside"):
            read_tasks(task_dir / "t.yaml")
    (task_dir / "link.yaml").symlink_to(tmp_path / "secret.yaml")
    write(task_dir, {"t.yaml": "include: link.yaml\n"})
    with pytest.raises(TaskRefused, match="outside"):
        read_tasks(task_dir / "t.yaml")
    # an include cycle, and a wider root that allows the parent
    write(task_dir, {"c1.yaml": "include: c2.yaml\ntask: c\n", "c2.yaml": "include: c1.yaml\n"})
    with pytest.raises(TaskRefused, match="include cycle"):
        read_tasks(task_dir / "c1.yaml")


def test_templates_are_sandboxed_and_bounded() -> None:
    doc = {"q": "x", "items": [1, 2]}
    assert render("{{ q|upper }} {{ items|join(',') }} {{ q|regex_replace('x', 'y') }}", doc) == "X 1,2 y"
    for hostile in (
        "{{ q.__class__.__mro__ }}",
        "{{ items.append(3) }}",
        "{% include '/etc/passwd' %}",
        "{{ 'a' * 10**9 }}",
        "{{ q|center(10**9) }}",
        "{{ '%999999999s' % q }}",
        "{% for i in range(10**9) %}{% endfor %}",
        "{{ missing }}",
    ):
        with pytest.raises(TaskDataError):
            render(hostile, doc)


def test_a_template_that_never_ends_is_stopped(tmp_path: Path) -> None:
    loop = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    write(
        tmp_path,
        {
            "t.yaml": BASE + f'task: t\ndoc_to_text: "{loop}"\ndoc_to_target: a\n',
            "test.jsonl": rows(1),
            "train.jsonl": rows(1),
        },
    )
    with pytest.raises(TaskError, match="took over"):
        read_tasks_isolated(tmp_path / "t.yaml", timeout=5)
    [ok] = read_tasks_isolated(fidelity.TASKS_DIR / "gsm8k/gsm8k.yaml", data_dir=fidelity.DATA_DIR, limit=2)
    assert ok.name == "gsm8k" and len(ok.items) == 2
    with pytest.raises(TaskRefused, match="!function"):
        read_tasks_isolated(fidelity.HERE / "refused/wikitext/wikitext.yaml")


# --------------------------------------------------------------------------- lm-eval's filters


def test_regex_filter_and_exact_match_as_lm_eval() -> None:
    strict: list[dict[str, Any]] = [
        {"function": "regex", "regex_pattern": r"#### (\-?[0-9\.\,]+)"},
        {"function": "take_first"},
    ]
    flexible: list[dict[str, Any]] = [
        {"function": "regex", "group_select": -1, "regex_pattern": r"(-?[$0-9.,]{2,})|(-?[0-9]+)"},
        {"function": "take_first"},
    ]
    response = "She sells 9 eggs for $18.\n#### 1,018\n\nQuestion: then 42"
    assert apply_pipeline(response, strict) == "1,018"  # the first match, not the last
    assert apply_pipeline(response, flexible) == "42"  # group_select -1: the last; first non-empty group
    assert regex_filter("no number here", r"#### (\d+)") == "[invalid]"
    options: dict[str, Any] = {"ignore_case": True, "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}
    assert exact_match("1,018", "1018", **options)
    assert exact_match("$18.", "18", **options)
    assert not exact_match("18", "18.5", **options)
    assert not exact_match(" 18", "18")  # no stripping unless asked
    meta = {
        "filters": [
            {"name": "strict-match", "filter": strict},
            {"name": "flexible-extract", "filter": flexible},
        ],
        "metric": {"metric": "exact_match", **options},
    }
    grades = grade(response, meta, "1018")
    assert [(g.name, g.extracted, g.correct) for g in grades] == [
        ("strict-match", "1,018", True),
        ("flexible-extract", "42", False),
    ]


# --------------------------------------------------------------------------- the job and the manifest


def test_task_job_and_manifest_record_the_task() -> None:
    tasks = {t.name: t for t in read_tasks(fidelity.TASKS_DIR, data_dir=fidelity.DATA_DIR, limit=2)}
    base = JobSpec(dataset="s3://evalstream-datasets/x.jsonl", model="null")
    mc, warnings = task_job(tasks["arc_easy"], base)
    assert (mc.grader, mc.prompt_template, mc.system_prompt, mc.name) == (
        "loglikelihood",
        None,
        None,
        "arc_easy",
    )
    assert mc.task is not None and mc.task.files[0].path == "arc/arc_easy.yaml" and not warnings
    lm, warnings = task_job(tasks["gsm8k"], base)
    assert lm.grader == "lm_eval" and not warnings  # lm-eval's filters and exact_match
    gen, warnings = task_job(tasks["gsm8k"], base, grader="exact")
    assert gen.grader == "exact" and gen.generation.stop == ["Question:", "</s>", "<|im_end|>"]
    assert [w for w in warnings if "not lm-eval's filters" in w]
    roll, _ = task_job(tasks["pile_10k"], base)
    assert roll.grader == "perplexity"
    # every task's prompts are raw: lm-eval's context as it is, with no template of any kind
    assert mc.raw_prompt and lm.raw_prompt and gen.raw_prompt and roll.raw_prompt and not base.raw_prompt

    def manifest(job: JobSpec) -> dict[str, Any]:
        return build_manifest(
            job,
            dataset_uri="s3://b/k",
            dataset_sha256="a",
            content_sha256="b",
            dataset_format="jsonl",
            total=2,
            shard_count=1,
        )

    m = manifest(mc)
    assert m["task"]["name"] == "arc_easy" and "Question: {{question}}" in m["task"]["files"][0]["text"]
    assert m["task"]["sha256"] == mc.task.sha256 and m["task"]["reader"].startswith("lm-eval-0.4.13")
    assert "task" not in manifest(base)  # runs without a task keep their manifest (and hash)
    changed = msgspec.structs.replace(mc, task=msgspec.structs.replace(mc.task, sha256="0" * 64))
    assert manifest_sha256(manifest(changed)) != manifest_sha256(m)
    again = request_from_manifest(json.loads(json.dumps(m)))
    assert msgspec.convert(again.task, type(mc.task)) == mc.task
    # the raw prompt changes answers: recorded (and hashed), only for such runs
    assert m["prompt"]["raw"] is True and again.raw_prompt
    assert "raw" not in manifest(base)["prompt"] and not request_from_manifest(manifest(base)).raw_prompt
    assert manifest_sha256(manifest(msgspec.structs.replace(mc, raw_prompt=False))) != manifest_sha256(m)


def test_evalctl_submit_task_refuses_before_uploading(tmp_path: Path) -> None:
    """The CLI's checks: no stack is needed to refuse (nothing is read from it)."""
    import subprocess
    import sys

    def evalctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "evalstream.cli", "submit", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    gsm8k = str(fidelity.TASKS_DIR / "gsm8k" / "gsm8k.yaml")
    for args, message in (
        ((gsm8k, "--max-tokens", "5"), "--max-tokens: a task's YAML sets its prompts and generation"),
        (("x.jsonl", "--task", gsm8k), "give a DATASET or --task PATH"),
        ((gsm8k,), "'openai/gsm8k' is a Hugging Face hub dataset"),
        ((str(fidelity.HERE / "refused/wikitext/wikitext.yaml"),), "doc_to_target: !function"),
    ):
        argv = args if args[0] == "x.jsonl" else ("--task", *args)
        proc = evalctl(*argv)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr, proc.stderr
