"""The item browser's pure parts (issue 18): hostile model output rendered as text only,
every page's Content-Security-Policy matching its one stylesheet, filters and cursors
that refuse forged input, bounded evidence, and the histogram bootstrap."""

from __future__ import annotations

import base64
import hashlib
import math
import random
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from evalstream.common import evidence
from evalstream.common.analysis import compare_html, items, items_html, paired, report_html
from evalstream.common.analysis.items import ComparePage, ItemFilter, ItemPage
from evalstream.common.analysis.pages import CSP, CSP_HEADER, CSS, error_page, escape, head
from evalstream.common.messages import ChatMessage, Item

HOSTILE = [
    "<script>document.title='pwned'</script>",
    "<img src=x onerror=\"document.title='pwned'\">",
    '<a href="javascript:alert(1)">click</a>',
    "[click](javascript:alert(1))",
    "</pre></td></tr></table><script>alert(2)</script>",
    "<svg onload=alert(3)><style>body{background:url(//evil/x)}</style>",
    "' onmouseover='alert(4)",
    '"><iframe src="javascript:alert(5)"></iframe>',
]


class Tags(HTMLParser):
    """Every start tag with its attributes, as a browser's parser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def parse(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    return tags


def assert_inert(page: str) -> None:
    tags = parse(page)
    names = [t for t, _ in tags.tags]
    assert not {"script", "img", "iframe", "svg", "object", "embed"} & set(names), names
    assert names.count("style") == 1 and names.count("meta") == 4  # charset, CSP, referrer, viewport
    for tag, attrs in tags.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("href", "action", "src"):
                assert value is not None and (value.startswith("/") or value.startswith("data:")), (
                    tag,
                    value,
                )


def assert_csp_matches_style(page: str) -> None:
    tags = parse(page)
    csp = next(
        a["content"] for t, a in tags.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
    )
    assert csp is not None and "default-src 'none'" in csp and "unsafe" not in csp and "script-src" not in csp
    (style,) = tags.styles
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp


def row(i: int, response: str, **extra: Any) -> dict[str, Any]:
    base = {
        "item_id": f"i{i}",
        "category": "<b>cat</b>",
        "outcome": 1,
        "score": 0.0,
        "attempts": 1,
        "served_by": "g/replay",
        "latency_ms": 3.0,
        "cache_hit": False,
        "truncated": False,
        "question": "What is <i>1</i>?",
        "gold": "1",
        "response": response,
        "extracted": response,
        "error": None,
        "detail": response,
        "evidence": response,
        "prompt": f"<|user|>{response}",
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "model_revision": "abc",
    }
    return {**base, **extra}


def test_hostile_answers_render_as_text_on_every_page() -> None:
    rows = [row(i, text) for i, text in enumerate(HOSTILE)]
    page = ItemPage("run-1", ItemFilter(text="<script>"), rows, matching=len(rows), next_after=None)
    listing = items_html.items_page(page, {"category": ["<b>cat</b>"], "served_by": ["g/replay"]})
    static = ItemPage("run-1", ItemFilter(), rows, matching=len(rows), next_after=None, full=True)
    stats = {
        "items": {"a": 8, "b": 8, "common": 8},
        "identical_responses": 0,
        "accuracy": {"a": 0.5, "b": 0.5, "delta": 0.0, "ci": [-0.1, 0.1], "confidence": 0.95},
        "mcnemar": {"right_in_a_only": 1, "right_in_b_only": 1, "p_value": 1.0},
    }
    pairs = [
        {**row(i, text), "rank": 0, "a_outcome": 3, "b_outcome": 1, "a_response": text, "b_response": text}
        for i, text in enumerate(HOSTILE)
    ]
    compare = ComparePage("a", "b", "flipped", stats, pairs)
    pages = [
        listing,
        items_html.item_page("run-1", rows[0]),
        compare_html.compare_document(compare, ["<script>a</script>", "b"], live=True),
        compare_html.compare_document(compare, ["a", "b"], live=False),
        error_page(404, "<script>x</script>"),
        head("t", CSS, CSP) + items_html.report_section(static, {}, live=False) + "</html>",
    ]
    for page_html in pages:
        assert_inert(page_html)
    for text in HOSTILE:  # and the text itself is all there, to read
        assert escape(text) in listing
    # the static report's rows open to the whole item, still as text
    assert "<details class='item'>" in pages[-1] and escape(HOSTILE[4]) in pages[-1]


def test_every_page_carries_a_policy_naming_its_own_stylesheet() -> None:
    page = ItemPage("r", ItemFilter(), [row(0, "x")], matching=1, next_after=None)
    for html_text in (
        items_html.items_page(page, {}),
        items_html.item_page("r", row(0, "x")),
        error_page(400, "bad"),
    ):
        assert_csp_matches_style(html_text)
    data = report_html.ReportData(
        summary={"run_id": "r", "total": 1, "accuracy": 0.0, "status": "completed"},
        latency_counts=[0] * (len(report_html.LATENCY_EDGES_MS) + 1),
        timeline_step_s=1.0,
        timeline=[],
        items=page,
        live=True,
    )
    report = report_html.render(data)
    assert_csp_matches_style(report)
    assert "<form class='filters' method='get' action='/runs/r/items'>" in report
    assert CSP_HEADER.endswith("frame-ancestors 'none'") and "frame-ancestors" not in CSP


def test_rows_flag_truncated_prompts_and_clipped_text_and_show_errors() -> None:
    clipped = row(0, "a" * 300, response_chars=5000, truncated=True)
    failed = {**row(1, ""), "outcome": 0, "error": "RuntimeError: engine died", "response": None}
    html_text = items_html.items_table(ItemPage("r", ItemFilter(), [clipped, failed], 2, None), link=True)
    assert "prompt truncated" in html_text and "+4700 chars" in html_text
    assert "RuntimeError: engine died" in html_text and "o-failed" in html_text
    assert "href='/runs/r/items/i0'" in html_text


def test_a_long_answer_is_clipped_on_its_page_with_a_link_to_all_of_it() -> None:
    long = "word " * 10_000
    page = items_html.item_page("r/1", row(0, long, item_id="a b/c"))
    assert f"showing {items_html.ANSWER_SHOWN_CHARS} of {len(long)} characters" in page
    assert "href='/runs/r%2F1/items/a%20b%2Fc/response.txt'" in page


def test_filters_validate_and_match_literally() -> None:
    flt = ItemFilter.from_query({"outcome": "wrong", "category": " arithmetic ", "q": "50%_off", "x": "y"})
    assert flt == ItemFilter("wrong", "arithmetic", None, "50%_off")
    args: list[Any] = ["run"]
    where = flt.where(args)
    assert args == ["run", 1, "arithmetic", "%50\\%\\_off%"] and "outcome = $2" in where
    assert ItemFilter.from_query({"q": "a\x01b"}).text == "ab"  # the join character of the searched fields
    assert ItemFilter.from_query({"outcome": ""}) == ItemFilter()
    with pytest.raises(ValueError, match="outcome"):
        ItemFilter.from_query({"outcome": "right'; DROP TABLE runs; --"})
    with pytest.raises(ValueError, match="longer"):
        ItemFilter.from_query({"q": "x" * 201})


def test_cursors_round_trip_and_refuse_forgeries() -> None:
    cursor = items.encode_cursor([1, "item/ü 7"])
    assert items.decode_cursor(cursor, 2) == [1, "item/ü 7"]
    assert items.decode_cursor("", 2) is None
    for bad in (
        "!!!",
        items.encode_cursor(["1", "x"]),
        items.encode_cursor([True, "x"]),
        items.encode_cursor([1]),
        "A" * 3000,
    ):
        with pytest.raises(ValueError):
            items.decode_cursor(bad, 2)


def test_evidence_is_bounded_and_says_so() -> None:
    assert evidence.clip("abc", 5) == "abc" and evidence.clip(None, 5) is None
    cut = evidence.clip("x" * 10, 4)
    assert cut is not None and cut.startswith("xxxx\n") and "6 more characters" in cut
    chat = Item(
        id="1",
        messages=[ChatMessage("user", "first"), ChatMessage("assistant", "a"), ChatMessage("user", "last")],
    )
    assert evidence.question_of(chat) == "last"
    big = Item(id="2", question="q" * 10_000, answer="g" * 5_000)
    assert len(evidence.question_of(big) or "") < evidence.MAX_QUESTION_CHARS + 60
    assert len(evidence.gold_of(big) or "") < evidence.MAX_GOLD_CHARS + 60


def test_histogram_bootstrap_matches_item_resampling() -> None:
    """Resampling the histogram of differences is resampling items: the interval agrees
    with a naive item-by-item bootstrap to within Monte Carlo noise."""
    rng = random.Random(1)
    a = [float(rng.random() < 0.6) for _ in range(2000)]
    b = [x if rng.random() < 0.8 else 1.0 - x for x in a]
    lo, hi = paired.paired_bootstrap_ci(a, b) or (0.0, 0.0)
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(2000))
    assert lo == pytest.approx(means[50], abs=0.005) and hi == pytest.approx(means[1949], abs=0.005)
    assert paired.bootstrap_ci_from_counts({}) is None
    assert paired.bootstrap_ci_from_counts({1.0: 7}) == (1.0, 1.0)


def test_page_html_has_no_nested_quotes_left_unescaped() -> None:
    """Attribute values built from ids are quoted and escaped: an id cannot open an attribute."""
    page = items_html.items_table(
        ItemPage("r", ItemFilter(), [row(0, "x", item_id="' onclick='x")], 1, None), link=True
    )
    assert re.search(r"onclick", page) and not any(n.startswith("on") for _, a in parse(page).tags for n in a)


def test_page_paths_split_before_decoding() -> None:
    from evalstream.aggregator.web import HttpError, path_parts

    scope = {"path": "/runs/r 1/items/a/b", "raw_path": b"/runs/r%201/items/a%2Fb"}
    assert path_parts(scope) == ["runs", "r 1", "items", "a/b"]
    assert path_parts({"path": "/compare/x/y"}) == ["compare", "x", "y"]
    with pytest.raises(HttpError):
        path_parts({"path": "/runs/" + "x" * 3000})


def test_mcnemar_is_fast_and_continuous_past_the_exact_range() -> None:
    """Integers up to EXACT_UP_TO discordant pairs, log space beyond: both agree at the seam,
    and a 150,000-item comparison's 60,000 discordant pairs take no time."""
    half = paired.EXACT_UP_TO // 2
    exact = paired.mcnemar_exact(half - 40, half + 40)
    assert paired.mcnemar_exact(half - 40, half + 41) == pytest.approx(exact, rel=0.05)
    m, n = half - 40, 2 * half
    log_space = 2 * sum(
        math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))
        for k in range(m + 1)
    )
    assert exact == pytest.approx(log_space, rel=1e-9)
    assert paired.mcnemar_exact(30_000, 30_000) == pytest.approx(1.0, abs=0.01)
    assert paired.mcnemar_exact(29_000, 31_000) < 1e-10
