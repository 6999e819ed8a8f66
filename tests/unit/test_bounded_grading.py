"""Grading that cannot hang a worker (issue 12): built-in graders linear on degenerate answers,
user patterns on RE2 or under a deadline, the grading pool's per-item deadline, and the
rewritten patterns reading normal answers exactly as the old ones did."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator

import pytest

from evalstream.common.deliveries import DeliveryCounter
from evalstream.common.messages import Item
from evalstream.worker.grading import clean, get_grader, judge, multiple_choice, numeric
from evalstream.worker.grading.exact import contains_word
from evalstream.worker.grading.patterns import compile_pattern
from evalstream.worker.grading_pool import GradeTask, GradingPool
from tests.degenerate import DEGENERATE

GRADED: dict[str, Item] = {  # every built-in string grader, with an item it can grade
    "exact": Item(id="e", question="q", answer="Paris"),
    "numeric": Item(id="n", question="q", answer="42"),
    "choice": Item(id="c", question="q", answer="B", choices=["red", "green", "blue"]),
    "contains": Item(id="k", question="q", answer="the capital"),
    "json": Item(id="j", question="q", answer="1"),
    "regex": Item(id="r", question="q", answer="Paris"),  # the gold answer as the pattern
    "regex:Answer:\\s*(\\w+)": Item(id="x", question="q", answer="Paris"),
}


@pytest.fixture(scope="module")
def pool() -> Iterator[GradingPool]:
    p = GradingPool(processes=2, timeout_s=5.0, memory_bytes=1024 * 1024 * 1024)
    p.start()
    yield p
    p.close()


def test_every_degenerate_answer_is_graded_by_every_grader_within_the_deadline(pool: GradingPool) -> None:
    tasks = [GradeTask(spec, text, item) for spec, item in GRADED.items() for text in DEGENERATE.values()]
    replies = pool.grade(tasks)
    for task, reply in zip(tasks, replies, strict=True):
        name = next(k for k, v in DEGENERATE.items() if v is task.response)
        assert reply.error is None, f"{task.spec} on {name}: {reply.error}"
        assert reply.grade is not None and not reply.grade.correct, f"{task.spec} on {name}"
    assert pool.killed == 0


@pytest.mark.parametrize(
    "step",
    [
        clean.clean_response,
        clean.extract_code,
        clean.extract_json,
        judge.parse_verdict,
        lambda text: judge.judge_messages(text, GRADED["exact"]),
    ],
    ids=["clean_response", "extract_code", "extract_json", "parse_verdict", "judge_messages"],
)
def test_cleaning_and_judge_parsing_finish_on_degenerate_answers(
    pool: GradingPool, step: Callable[[str], object]
) -> None:
    # These run in the worker's threads (code and judge graders), not in the pool: they must
    # be linear by construction. A regex bomb here would hold the test for minutes.
    for text in DEGENERATE.values():
        step(text)


def test_the_choice_grader_still_reads_a_letter_after_a_long_run_of_spaces() -> None:
    item = GRADED["choice"]
    grade = get_grader("choice", item)("The answer" + " " * 3000 + "is B", item)
    assert (grade.extracted, grade.correct) == ("B", True)


def test_a_user_pattern_that_backtracks_forever_fails_its_item_and_only_it(pool: GradingPool) -> None:
    killed = pool.killed
    bomb = Item(id="bomb", question="q", answer="a", meta={"regex": r"(a|aa)+\1$"})  # RE2 cannot: \1
    good = Item(id="good", question="q", answer="42")
    tasks = [GradeTask("numeric", f"it is {i}", good) for i in range(40)]
    tasks.insert(17, GradeTask("regex", "a" * 60 + "!", bomb))
    replies = pool.grade(tasks)
    assert replies[17].grade is None
    assert replies[17].error is not None and replies[17].error.startswith("GradingTimeout: grader regex")
    others = replies[:17] + replies[18:]
    assert [r.grade.extracted if r.grade else r.error for r in others] == [str(i) for i in range(40)]
    # one kill when its chunk went silent, one when it overran again graded alone
    assert pool.killed == killed + 2
    # the pool goes on with fresh processes
    assert pool.grade([GradeTask("exact", "Paris", GRADED["exact"])])[0].grade.correct  # type: ignore[union-attr]


def test_a_grader_error_in_the_pool_is_the_item_s_error(pool: GradingPool) -> None:
    (reply,) = pool.grade([GradeTask("numeric", "12", Item(id="x", question="q", answer="not a number"))])
    assert reply.grade is None and reply.error is not None
    assert reply.error.startswith("GradingError: item x: gold answer 'not a number' is not a number")


@pytest.mark.parametrize(
    ("pattern", "text", "engine", "found"),
    [
        (r"(a+)+$", "a" * 40 + "!", "re2", []),  # exponential in Python's engine, linear in RE2
        (r"Answer:\s*(\w+)", "Answer: Paris", "re2/python", ["Paris"]),
        (r"\w+", "héllo wörld", "re2/python", ["héllo", "wörld"]),  # Unicode \w, as Python reads it
        (r"\d+", "٣ and 3", "re2/python", ["٣", "3"]),  # Arabic-Indic digit: \d in Python
        (r"a{,3}", "aaaa", "python", ["aaa", "a", ""]),  # RE2 would read "{,3}" as text
        (r"[[:alpha:]]+", "xa]]", "python", ["a]]"]),  # "[:alph" then "]+" in Python; POSIX in RE2
        (r"(?<=x)y", "xy", "python", ["y"]),  # lookbehind: Python only
        (r"(?i)paris", "PARIS", "re2", ["PARIS"]),
    ],
)
@pytest.mark.filterwarnings("ignore:Possible nested set:FutureWarning")
def test_user_patterns_run_on_re2_only_where_it_reads_them_as_python_does(
    pattern: str, text: str, engine: str, found: list[str]
) -> None:
    compiled = compile_pattern(pattern)
    assert compiled.engine == engine
    assert [m[1] if compiled.groups else m[0] for m in compiled.finditer(text)] == found
    short = text[-12:]  # Python's own reading, on text short enough for its engine
    assert [m[0] for m in compiled.finditer(short)] == [m[0] for m in re.finditer(pattern, short)]


# ------------------------------------------------------------ the rewrites change no grade

# The patterns as they were before the rewrite: super-linear on degenerate text, but on short
# random text they say what the new code must still say.
OLD_MARKER = r"(?i:{marker})\s*(?:is\b|:)?\s*[:\-]?\s*[(\[*]*([ABCD])(?![\w'])"
OLD_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S | re.I)
OLD_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
OLD_NUMBER = re.compile(
    r"""(?<![A-Za-z0-9_.])(?P<sign>[-+−])?\$?
    (?:(?P<num>\d+)\s*/\s*(?P<den>\d+)
      |(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<dec>\.\d+)?
      |(?P<lead>\.\d+))
    (?P<exp>[eE][-+]?\d+)?""",
    re.X,
)


def _old_strip_think(text: str) -> str:
    text = OLD_THINK_BLOCK.sub("", text)
    closes = list(re.finditer(r"</think>", text, re.I))
    if closes:
        text = text[closes[-1].end() :]
    opened = re.search(r"<think>", text, re.I)
    return text[: opened.start()] if opened else text


def _random_texts(alphabet: list[str], n: int = 3000, length: int = 12, seed: int = 12) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, length))) for _ in range(n)]


def test_choice_markers_match_as_before() -> None:
    alphabet = ["answer", "option", "Choice", " ", "\t", "is", ":", "-", "(", "[", "*", "A", "B", "s", "'"]
    for text in _random_texts(alphabet):
        for marker in ("answer", "option|choice"):
            old = re.findall(OLD_MARKER.format(marker=marker), text)
            assert multiple_choice.marked_letters(text, marker, "ABCD") == old, text


def test_think_blocks_are_removed_as_before() -> None:
    for text in _random_texts(["<think>", "</think>", "<THINK>", "a", "\n", "<thi", "nk>", "</"]):
        assert clean.strip_think(text) == _old_strip_think(text), text


def test_fenced_blocks_are_found_as_before() -> None:
    for text in _random_texts(["```", "python", " ", "\n", "x", "`", "#", "\t"], length=16):
        assert clean.fenced_blocks(text) == OLD_FENCE.findall(text), text


def test_numbers_are_found_as_before() -> None:
    for text in _random_texts(
        ["1", "23", " ", "/", ",", ".", "-", "e", "$", "a", "\\frac{1}{2}", "\\boxed{"]
    ):
        old = [m.group(0) for m in OLD_NUMBER.finditer(text)]
        assert [m.group(0) for m in numeric.NUMBER.finditer(text)] == old, text


def test_whole_words_are_found_as_before() -> None:
    for text in _random_texts(["42", "4", "2", ".", ",", "5", " ", "a", "é", "_"], length=10):
        for word in ("42", "a", "4 2"):
            old = re.search(rf"(?<!\w){re.escape(word)}(?!\w|[.,]\d)", text) is not None
            assert contains_word(text, word) == old, (text, word)


# ------------------------------------------------------------ redelivery counting


class _Record:
    def __init__(self, offset: int, partition: int = 0, topic: str = "eval.work.x") -> None:
        self.topic, self.partition, self.offset = topic, partition, offset


def test_a_record_delivered_more_than_the_limit_is_worn() -> None:
    counter = DeliveryCounter(limit=2)
    a, b = _Record(1), _Record(2)
    for delivery in (1, 2):
        keep, worn = counter.split([a, b] if delivery == 1 else [a])
        assert [n for _, n in keep] == ([1, 1] if delivery == 1 else [2]) and worn == []
    counter.failed(a, RuntimeError("boom"))
    keep, worn = counter.split([a, _Record(2, partition=1)])  # same offset, another partition: new
    assert [(r.offset, n) for r, n in worn] == [(1, 3)] and [n for _, n in keep] == [1]
    assert counter.why(a, 3).startswith("delivered 3 times") and "RuntimeError: boom" in counter.why(a, 3)


def test_the_counter_forgets_the_oldest_records_first() -> None:
    counter = DeliveryCounter(limit=1, capacity=2)
    for offset in (1, 2, 3):
        counter.count(_Record(offset))
    assert counter.count(_Record(1)) == 1 and counter.count(_Record(3)) == 2
