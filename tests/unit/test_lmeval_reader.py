"""The lm-eval task reader (evalstream.common.lmeval): lm-eval 0.4.13's own task YAMLs render
to exactly the requests lm-eval builds (recorded from lm-eval itself in
tests/lmeval_tasks/expected.json; tests/unit/test_lmeval_fidelity.py compares live), each
supported key does what lm-eval does with it, each unsupported one is refused by name, and a
hostile YAML reads nothing outside its folder and runs no code."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from evalstream.common.lmeval import RenderedTask, TaskDataError, TaskError, TaskRefused, read_tasks
from evalstream.common.lmeval.isolation import read_tasks_isolated
from evalstream.common.lmeval.submission import dataset_bytes, task_job
from evalstream.common.lmeval.templates import render
from evalstream.common.lmeval_filters import apply_pipeline, exact_match, grade, regex_filter
from evalstream.common.manifest import build_manifest, manifest_sha256, request_from_manifest
from evalstream.common.messages import Item, JobSpec
from tests.lmeval_tasks import fidelity


def q(item: Item) -> str:
    assert item.question is not None
    return item.question


def lm(item: Item) -> dict[str, Any]:
    assert item.meta is not None
    meta: dict[str, Any] = item.meta["lm_eval"]
    return meta


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


# --------------------------------------------------------------------------- keys, on small tasks


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text.startswith(BASE):  # BASE and what follows it, each dedented
            text = textwrap.dedent(BASE) + textwrap.dedent(text[len(BASE) :])
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def rows(n: int, **extra: Any) -> str:
    return "".join(
        json.dumps(
            {"q": f"question {i}", "a": f"answer {i}", "label": i % 3, "opts": ["x", "y", "z"], **extra}
        )
        + "\n"
        for i in range(n)
    )


BASE = """\
    dataset_path: json
    dataset_kwargs:
      data_files:
        train: train.jsonl
        test: test.jsonl
    test_split: test
    """


def one(folder: Path, yaml: str, name: str = "t.yaml", **kwargs: Any) -> RenderedTask:
    write(folder, {name: yaml})
    [task] = read_tasks(folder / name, **kwargs)
    return task


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write(tmp_path, {"train.jsonl": rows(8), "test.jsonl": rows(4)})
    return tmp_path


def test_templates_fields_and_delimiters(folder: Path) -> None:
    task = one(
        folder,
        BASE
        + """\
    task: t
    output_type: multiple_choice
    description: "About {{q.split(' ')[0]}}:\\n"
    doc_to_text: "Q: {{q}}"
    doc_to_choice: opts
    doc_to_target: label
    target_delimiter: " => "
    """,
    )
    item = task.items[1]
    assert q(item) == "About question:\nQ: question 1"
    assert item.choices == ["x", "y", "z"] and item.answer == "1"
    assert lm(item)["target_delimiter"] == " => "


def test_doc_to_choice_forms_and_target_by_text(folder: Path) -> None:
    for choice, target, gold in (
        ('["x", "y", "z"]', '"{{opts[2]}}"', "2"),  # a list; a target given as the choice's text
        ("{a: x, b: y, c: z}", "1", "1"),  # a mapping: its values; an index
        ('"{{opts}}"', '"{{label}}"', None),  # a template rendering a list; a digit string
    ):
        task = one(
            folder,
            BASE
            + f"task: t\noutput_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: {choice}\ndoc_to_target: {target}\n",
        )
        assert task.items[2].choices == ["x", "y", "z"]
        assert task.items[2].answer == (gold or "2")


def test_few_shot_examples_are_drawn_as_lm_eval_draws_them(folder: Path) -> None:
    yaml = (
        BASE
        + """\
    task: t
    output_type: generate_until
    training_split: train
    doc_to_text: "{{q}}"
    doc_to_target: "{{a}}"
    num_fewshot: 2
    fewshot_delimiter: " || "
    target_delimiter: " -> "
    """
    )
    task = one(folder, yaml)
    # lm-eval: one Random(1234) for the task, sampled from in document order (train has 8 docs)
    rnd = random.Random(1234)
    for item in task.items:
        picks = rnd.sample(range(8), 2)
        shots = "".join(f"question {i} -> answer {i} || " for i in picks)
        assert q(item) == shots + f"question {item.id}"
    again = one(folder, yaml)
    assert [i.question for i in again.items] == [i.question for i in task.items]  # deterministic
    other = read_tasks(folder / "t.yaml", fewshot_seed=7)[0]
    assert [i.question for i in other.items] != [i.question for i in task.items]
    override = read_tasks(folder / "t.yaml", num_fewshot=1)[0]
    assert q(override.items[0]).count(" || ") == 1 and override.source.num_fewshot == 1


def test_few_shot_from_the_evaluated_split_leaves_the_document_out(tmp_path: Path) -> None:
    write(tmp_path, {"test.jsonl": rows(3)})
    task = one(
        tmp_path,
        """\
    task: t
    dataset_path: json
    dataset_kwargs: {data_files: {test: test.jsonl}}
    test_split: test
    fewshot_split: test
    doc_to_text: "{{q}}"
    doc_to_target: "{{a}}"
    num_fewshot: 2
    """,
    )
    for item in task.items:  # each context: the two other documents
        assert f"question {item.id} answer" not in q(item)
        assert q(item).count(" answer ") == 2


def test_first_n_sampler_inline_samples_and_fewshot_overrides(folder: Path) -> None:
    task = one(
        folder,
        BASE
        + """\
    task: t
    output_type: generate_until
    doc_to_text: "{{q}}"
    doc_to_target: "{{a}}"
    num_fewshot: 2
    fewshot_config:
      sampler: first_n
      samples: [{q: s1, a: t1}, {q: s2, a: t2}, {q: s3, a: t3}]
      doc_to_text: "<{{q}}>"
      target_delimiter: "="
      fewshot_delimiter: ";"
    """,
    )
    assert q(task.items[0]) == "<s1>=t1;<s2>=t2;question 0"


def test_generation_kwargs_and_defaults(folder: Path) -> None:
    task = one(
        folder,
        BASE
        + """\
    task: t
    doc_to_text: q
    doc_to_target: a
    generation_kwargs: {until: "END", max_gen_toks: 32, do_sample: true, temperature: 0.7, top_p: 0.9}
    """,
    )
    g = task.generation
    assert g is not None and (g.stop, g.max_tokens, g.temperature, g.top_p) == (["END"], 32, 0.7, 0.9)
    default = one(folder, BASE + "task: t\ndoc_to_text: q\ndoc_to_target: a\nfewshot_delimiter: '##'\n")
    assert (
        default.generation is not None
        and default.generation.stop == ["##"]
        and default.generation.max_tokens == 256
    )
    assert default.filters == [{"name": "none", "filter": [{"function": "take_first"}]}]
    assert default.metrics == [{"metric": "exact_match"}]


def test_include_chain_group_and_tag(folder: Path) -> None:
    write(
        folder,
        {
            "base.yaml": BASE + "output_type: multiple_choice\ndoc_to_choice: opts\ndoc_to_target: label\n",
            "mid_yaml": "include: base.yaml\ndoc_to_text: 'mid {{q}}'\nmetadata: {version: 2}\n",
            "a.yaml": "include: mid_yaml\ntask: a\ntag: [family]\n",
            "b.yaml": "include: mid_yaml\ntask: b\ndoc_to_text: 'b {{q}}'\ntag: family\nshould_decontaminate: true\n",
            "c.yaml": "include: mid_yaml\ntask: c\n",
            "g.yaml": "group: g\ntask:\n  - family\n  - {task: c, num_fewshot: 1, training_split: train}\n"
            "aggregate_metric_list: [{metric: acc}]\n",
        },
    )
    [a] = read_tasks(folder / "a.yaml")
    assert q(a.items[0]) == "mid question 0"
    assert [f.path for f in a.source.files] == ["a.yaml", "mid_yaml", "base.yaml"]
    group = read_tasks(folder / "g.yaml")
    assert [(t.name, t.source.group, t.source.num_fewshot) for t in group] == [
        ("a", "g", 0),
        ("b", "g", 0),
        ("c", "g", 1),
    ]
    assert q(group[1].items[0]) == "b question 0"
    assert q(group[2].items[0]).count("mid question") == 2  # one example, then the document
    assert "g.yaml" in [f.path for f in group[0].source.files]
    folder_tasks = read_tasks(folder)
    assert [t.name for t in folder_tasks] == ["a", "b", "c"]  # a folder: its tasks, not its groups
    write(folder, {"bad.yaml": "group: bad\ntask: [nothing_here]\n"})
    with pytest.raises(TaskRefused, match="no task, group or tag 'nothing_here'"):
        read_tasks(folder / "bad.yaml")
    (folder / "empty").mkdir()
    with pytest.raises(TaskError, match="no task YAML"):
        read_tasks(folder / "empty")


def test_data_file_formats(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [{"q": "one", "label": 0}, {"q": "two", "label": 1}]
    pq.write_table(pa.Table.from_pylist(docs), tmp_path / "d.parquet")
    (tmp_path / "d.csv").write_text("q,label\none,0\ntwo,1\n")
    (tmp_path / "d.json").write_text(json.dumps(docs))
    for builder, file in (("parquet", "d.parquet"), ("csv", "d.csv"), ("json", "d.json")):
        task = one(
            tmp_path,
            f"task: t\ndataset_path: {builder}\ndataset_kwargs: {{data_files: {file}}}\ntest_split: train\n"
            'output_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: ["no", "yes"]\ndoc_to_target: label\n',
        )
        assert [(i.question, i.answer) for i in task.items] == [("one", "0"), ("two", "1")]


def test_hub_names_need_a_data_dir(tmp_path: Path) -> None:
    yaml = "task: t\ndataset_path: someone/set\ndataset_name: cfg\ntest_split: test\ndoc_to_text: q\ndoc_to_target: a\n"
    with pytest.raises(TaskDataError, match=r"--data-dir DIR, with DIR/someone/set/cfg/test.jsonl"):
        one(tmp_path, yaml)
    (tmp_path / "data").mkdir()
    with pytest.raises(TaskDataError, match=r"no local copy: expected .*/data/someone/set/cfg/test.jsonl"):
        one(tmp_path, yaml, data_dir=tmp_path / "data")
    write(tmp_path / "data", {"someone/set/cfg/test.jsonl": rows(2)})
    task = one(tmp_path, yaml, data_dir=tmp_path / "data")
    assert [i.answer for i in task.items] == ["answer 0", "answer 1"]


class FakeHub:
    """The hub as HuggingFaceHub reads it: Parquet files per split, repository files."""

    def __init__(self, tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.calls: list[tuple[str, ...]] = []
        self.parquet: list[bytes] = []
        for part in ([{"q": "h0", "a": "x0"}, {"q": "h1", "a": "x1"}], [{"q": "h2", "a": "x2"}]):
            pq.write_table(pa.Table.from_pylist(part), tmp / "p.parquet")
            self.parquet.append((tmp / "p.parquet").read_bytes())

    def split_files(self, repo: str, config: str | None, split: str) -> list[tuple[str, bytes]]:
        self.calls.append((repo, str(config), split))
        return [(f"{config}/{split}/{i:04d}.parquet", b) for i, b in enumerate(self.parquet)]

    def repo_file(self, repo: str, path: str) -> bytes:
        self.calls.append((repo, path))
        return b'{"q": "r0", "a": "y0"}\n'


def test_hub_datasets_where_the_hub_is_reachable(tmp_path: Path) -> None:
    hub = FakeHub(tmp_path)
    yaml = "task: t\ndataset_path: someone/set\ndataset_name: cfg\ntest_split: test\ndoc_to_text: q\ndoc_to_target: a\n"
    task = one(tmp_path, yaml, hub=hub)
    assert [(q(i), i.answer) for i in task.items] == [
        ("h0", "x0"),
        ("h1", "x1"),
        ("h2", "x2"),
    ]  # files in order
    assert hub.calls == [("someone/set", "cfg", "test")]
    write(tmp_path / "data", {"someone/set/cfg/test.jsonl": rows(1)})
    local = one(tmp_path, yaml, hub=hub, data_dir=tmp_path / "data")
    assert [q(i) for i in local.items] == ["question 0"] and len(hub.calls) == 1  # a local copy wins
    c4 = "task: t\ndataset_path: someone/set\ndataset_kwargs: {data_files: {test: en/part.json}}\ntest_split: test\ndoc_to_text: q\ndoc_to_target: a\n"
    assert [q(i) for i in one(tmp_path, c4, hub=hub).items] == ["r0"]
    assert hub.calls[-1] == ("someone/set", "en/part.json")
    with pytest.raises(TaskRefused, match="not a file of the dataset"):
        one(tmp_path, c4.replace("en/part.json", "../../x.json"), hub=hub)


def test_the_real_hub_unreachable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the child process reads it: no network attempt
    with pytest.raises(TaskDataError, match="hub dataset 'openai/gsm8k'"):
        read_tasks_isolated(fidelity.TASKS_DIR / "gsm8k/gsm8k.yaml", hub=True, limit=1, timeout=120)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("process_docs: !function utils.process\n", "process_docs"),
        ("process_results: !function utils.score\n", "process_results"),
        ("doc_to_target: !function utils.target\n", "doc_to_target"),
        (
            "filter_list: [{name: f, filter: [{function: !function utils.F}, {function: take_first}]}]\n",
            "filter_list[0].filter[0].function",
        ),
        ("unknown_key: 1\n", "unknown_key"),
        ("repeats: 4\n", "repeats"),
        ("output_type: ranking\n", "output_type"),
        ("use_prompt: promptsource:x\n", "use_prompt"),
        ("doc_to_image: image\n", "doc_to_image"),
        ("generation_kwargs: {until: [x], top_k: 5}\n", "generation_kwargs.top_k"),
        ("generation_kwargs: {temperature: 0.5}\n", "generation_kwargs.temperature"),
        ("metric_list: [{metric: bleu}]\n", "metric_list[0].metric"),
        ("metric_list: [{metric: exact_match, aggregation: median}]\n", "metric_list[0].aggregation"),
        (
            "metric_list: [{metric: exact_match, ignore_whitespace: true}]\n",
            "metric_list[0].ignore_whitespace",
        ),
        (
            "filter_list: [{name: f, filter: [{function: majority_vote}, {function: take_first}]}]\n",
            "filter_list[0].filter[0].function",
        ),
        (
            "filter_list: [{name: f, filter: [{function: regex, regex_pattern: '('}, {function: take_first}]}]\n",
            "filter_list[0].filter[0].regex_pattern",
        ),
        ("fewshot_config: {sampler: balanced}\n", "fewshot_config.sampler"),
        ("fewshot_config: {fewshot_indices: [1, 2]}\n", "fewshot_config.fewshot_indices"),
        ("dataset_kwargs: {data_files: {test: test.jsonl}, revision: main}\n", "dataset_kwargs.revision"),
        ("class: !function tasks.MyTask\n", "class"),
    ],
)
def test_unsupported_keys_are_refused_by_name(folder: Path, extra: str, key: str) -> None:
    yaml = "task: t\ndataset_path: json\ndataset_kwargs: {data_files: {test: test.jsonl}}\ntest_split: test\ndoc_to_text: q\ndoc_to_target: a\n"
    lines = [ln for ln in yaml.splitlines(keepends=True) if not ln.startswith(extra.split(":")[0] + ":")]
    with pytest.raises(TaskRefused) as info:
        one(folder, "".join(lines) + extra)
    assert info.value.key == key, str(info.value)
    assert key in str(info.value)


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


def test_other_yaml_tags_are_refused(folder: Path) -> None:
    with pytest.raises(TaskRefused, match="unsupported YAML tag"):
        one(folder, "task: !!python/object/apply:os.system ['echo hi']\n")


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


def test_bad_data_is_reported_per_document(folder: Path) -> None:
    write(
        folder, {"test.jsonl": rows(2) + json.dumps({"q": "q", "a": "a", "label": 7, "opts": ["x"]}) + "\n"}
    )
    with pytest.raises(
        TaskDataError, match=r"document 2: doc_to_target: gold index 7 is not one of 1 choices"
    ):
        one(
            folder,
            BASE
            + "task: t\noutput_type: multiple_choice\ndoc_to_text: q\ndoc_to_choice: opts\ndoc_to_target: label\n",
        )


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
