"""The lm-eval task reader (evalstream.common.lmeval) key by key, on small tasks: each
supported key does what lm-eval does with it, each unsupported one is refused by name, and bad
data is reported per document. Whole tasks: tests/unit/test_lmeval_reader_tasks.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from evalstream.common.lmeval import RenderedTask, TaskDataError, TaskError, TaskRefused, read_tasks
from evalstream.common.lmeval.isolation import read_tasks_isolated
from tests.lmeval_tasks import fidelity
from tests.unit.lmeval_task_files import BASE, lm, q, rows, write

# --------------------------------------------------------------------------- keys, on small tasks


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


def test_other_yaml_tags_are_refused(folder: Path) -> None:
    with pytest.raises(TaskRefused, match="unsupported YAML tag"):
        one(folder, "task: !!python/object/apply:os.system ['echo hi']\n")


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
