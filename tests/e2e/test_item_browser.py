"""Issue 18: the report lists the items. On the real stack, through replay runs whose
answers are known: the aggregator's report filters to wrong answers and opens an item to
its whole answer in headless Chromium; failed items show their error; long answers are
clipped with the whole one a link away; every page and the stored report carry the content
security policy; and the compare page lists exactly the items that flipped. Answers made of
HTML and script: tests/e2e/test_item_browser_hostile.py."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from evalstream.common import storage
from evalstream.common.analysis import items_html, paired, report_html
from evalstream.common.settings import Settings
from tests.chromium import Chromium
from tests.e2e.helpers import evalctl, replay_run
from tests.e2e.test_report import AGGREGATOR, http_get

pytestmark = pytest.mark.stack

LONG_ANSWER = "I think about it. " * 2000 + "So 999."


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """30 items: b000-b011 right, b012-b026 wrong (b014 with a 36,000-character answer),
    b027-b029 without an answer (failed, "no replayed answer")."""
    tmp = tmp_path_factory.mktemp("browser")
    items = [
        {
            "id": f"b{i:03d}",
            "question": f"What is {i} + 1?",
            "answer": str(i + 1),
            "category": ["even", "odd"][i % 2],
        }
        for i in range(30)
    ]
    answers = {f"b{i:03d}": str(i + 1) if i < 12 else f"It is {i + 7}." for i in range(27)}
    answers["b014"] = LONG_ANSWER
    summary = replay_run(tmp, "browser", items, answers)
    assert summary["failed"] == 3 and summary["succeeded"] == 27
    return {"summary": summary, "answers": answers}


def rows_of(page: Any) -> list[dict[str, str]]:
    value = page.evaluate(
        """JSON.stringify([...document.querySelectorAll('tr.item-row')].map(r => ({
             item: r.cells[0].innerText.trim(), outcome: r.cells[1].innerText.trim(),
             category: r.cells[2].innerText.trim()})))"""
    )
    return list(json.loads(value))


async def test_report_filters_to_wrong_answers_and_opens_one(run: dict[str, Any], tmp_path: Path) -> None:
    run_id = run["summary"]["run_id"]
    url = f"{AGGREGATOR}/runs/{run_id}/report.html"

    def browse() -> dict[str, Any]:
        with Chromium(tmp_path) as browser:
            page = browser.open(url)
            first = rows_of(page)
            filtered_url = browser.navigate_by(
                page,
                "document.querySelector('form.filters select[name=outcome]').value = 'wrong';"
                "document.querySelector('form.filters').requestSubmit()",
            )
            wrong = rows_of(page)
            matching = page.evaluate("document.querySelector('.matching').textContent")
            opened = page.evaluate("document.querySelector('a.item').textContent")
            item_url = browser.navigate_by(page, "document.querySelector('a.item').click()")
            answer = page.evaluate("document.querySelector('pre[data-field=response]').textContent")
            gold = page.evaluate("document.querySelector('pre[data-field=gold]').textContent")
            prompt = page.evaluate("document.querySelector('pre[data-field=prompt]').textContent")
            return {
                "first": first,
                "filtered_url": filtered_url,
                "wrong": wrong,
                "matching": matching,
                "opened": opened,
                "item_url": item_url,
                "answer": answer,
                "gold": gold,
                "prompt": prompt,
                "errors": page.console_errors,
                "requests": page.requests,
            }

    seen = await asyncio.to_thread(browse)
    # the report's first page: failed items, then wrong ones, then right ones
    outcomes = [r["outcome"] for r in seen["first"]]
    assert outcomes == ["failed"] * 3 + ["wrong"] * 15 + ["right"] * 12, outcomes
    assert urllib.parse.urlsplit(seen["filtered_url"]).path == f"/runs/{run_id}/items"
    assert "outcome=wrong" in seen["filtered_url"]
    assert [r["item"] for r in seen["wrong"]] == [f"b{i:03d}" for i in range(12, 27)]
    assert {r["outcome"] for r in seen["wrong"]} == {"wrong"} and seen["matching"] == "15"
    assert seen["opened"] == "b012" and seen["item_url"].endswith(f"/runs/{run_id}/items/b012")
    assert seen["answer"] == run["answers"]["b012"] == "It is 19." and seen["gold"] == "13"
    assert "What is 12 + 1?" in seen["prompt"]
    assert seen["errors"] == [], "a CSP violation or a script error shows here"
    assert all(r.startswith(AGGREGATOR) for r in seen["requests"]), seen["requests"]


def test_filters_failed_items_text_search_and_category(run: dict[str, Any]) -> None:
    run_id = run["summary"]["run_id"]
    base = f"{AGGREGATOR}/runs/{run_id}/items"

    def ids(query: str) -> list[str]:
        status, _, page = http_get(f"{base}?{query}")
        assert status == 200, page[:300]
        return re.findall(r"<a class='item' href='[^']*'>([^<]*)</a>", page)

    status, _, failed = http_get(f"{base}?outcome=failed")
    assert re.findall(r"<a class='item' href='[^']*'>([^<]*)</a>", failed) == ["b027", "b028", "b029"]
    assert failed.count("no replayed answer") == 3 and failed.count("<td class='o-failed'>") == 3
    # "It is 20." .. "It is 29." (b014's answer is the long one)
    assert ids("q=It+is+2") == ["b013", *(f"b{i:03d}" for i in range(15, 23))]
    assert ids("category=odd&outcome=right") == [f"b{i:03d}" for i in range(1, 12, 2)]
    assert ids("q=%25") == []  # a literal %, not a wildcard
    assert http_get(f"{base}?outcome=bogus")[0] == 400
    assert http_get(f"{base}?after=forged")[0] == 400
    assert http_get(f"{base}/no-such-item")[0] == 404
    # pages are keyset cursors: walking them by the next link yields every item once
    seen: list[str] = []
    url = f"{base}?category=even&limit=4"
    for _ in range(10):
        status, _, page = http_get(url)
        assert status == 200
        found = re.findall(r"<a class='item' href='[^']*'>([^<]*)</a>", page)
        assert 0 < len(found) <= 4
        seen += found
        nxt = re.search(r"<a class='next' href='([^']*)'", page)
        if not nxt:
            break
        url = AGGREGATOR + nxt.group(1).replace("&amp;", "&")
    # in outcome order (failed, wrong, right), each item once
    assert sorted(seen) == [f"b{i:03d}" for i in range(0, 30, 2)] and len(seen) == 15
    assert seen[0] == "b028" and seen[-1] == "b010"


def test_a_long_answer_is_clipped_and_served_whole(run: dict[str, Any]) -> None:
    run_id = run["summary"]["run_id"]
    status, _, report = http_get(f"{AGGREGATOR}/runs/{run_id}/report.html")
    assert status == 200 and f"+{len(LONG_ANSWER) - 300} chars" in report
    status, _, page = http_get(f"{AGGREGATOR}/runs/{run_id}/items/b014")
    assert f"showing {items_html.ANSWER_SHOWN_CHARS} of {len(LONG_ANSWER)} characters" in page
    link = re.search(r"<a id='whole-answer' href='([^']*)'", page)
    assert link and link.group(1) == f"/runs/{run_id}/items/b014/response.txt"
    import urllib.request

    with urllib.request.urlopen(AGGREGATOR + link.group(1), timeout=30) as r:
        assert r.headers["content-type"] == "text/plain; charset=utf-8"
        assert (
            "sandbox" in r.headers["content-security-policy"]
            and r.headers["x-content-type-options"] == "nosniff"
        )
        assert r.read().decode() == LONG_ANSWER


def test_every_page_and_the_stored_report_carry_the_policy(run: dict[str, Any], stack: Settings) -> None:
    import urllib.error
    import urllib.request

    run_id = run["summary"]["run_id"]
    for path in (
        f"/runs/{run_id}/report.html",
        f"/runs/{run_id}/items",
        f"/runs/{run_id}/items/b001",
        f"/compare/{run_id}/{run_id}",
        f"/runs/{run_id}/items?outcome=nope",
        "/runs/none/report.html",
    ):
        try:
            with urllib.request.urlopen(AGGREGATOR + path, timeout=30) as r:
                headers = r.headers
        except urllib.error.HTTPError as e:
            headers = e.headers
        csp = headers["content-security-policy"]
        assert csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, path
        assert "script" not in csp and "unsafe" not in csp, path
        assert headers["x-content-type-options"] == "nosniff", path
    stored = storage.get_bytes(
        storage.client(stack), stack.s3_bucket_results, report_html.object_name(run_id)
    ).decode()
    assert f'<meta http-equiv="Content-Security-Policy" content="{report_html.CSP}' in stored.replace(
        "&#x27;", "'"
    )
    # the stored copy lists the items too, each opening to all of it
    assert stored.count("<details class='item'>") == 30 and "It is 19." in stored


# --------------------------------------------------------------------------- compare


def test_compare_lists_exactly_the_flipped_items(tmp_path: Path) -> None:
    """20 items; A right on c000-c011, B right on c000-c007 and c012-c017: c008-c011 flipped
    right -> wrong, c012-c017 wrong -> right, and nothing else."""
    items = [{"id": f"c{i:03d}", "question": f"What is {i} * 2?", "answer": str(2 * i)} for i in range(20)]
    a = replay_run(
        tmp_path, "compare-a", items, {f"c{i:03d}": str(2 * i) if i < 12 else "-1" for i in range(20)}
    )
    b = replay_run(
        tmp_path,
        "compare-b",
        items,
        {f"c{i:03d}": str(2 * i) if i < 8 or 12 <= i < 18 else f"{2 * i + 1}" for i in range(20)},
    )
    a_only, b_only = [f"c{i:03d}" for i in range(8, 12)], [f"c{i:03d}" for i in range(12, 18)]
    status, ctype, page = http_get(f"{AGGREGATOR}/compare/{a['run_id']}/{b['run_id']}")
    assert status == 200 and ctype.startswith("text/html")
    listed = re.findall(r"<tr class='pair rank-(\d)' data-item='([^']*)'>", page)
    assert listed == [("0", i) for i in a_only] + [("1", i) for i in b_only]
    # both answers beside each other: c009 was 18 in A, 19 in B
    row = page[page.index("data-item='c009'") :].split("</tr>", 1)[0]
    assert "<td class='t answer-a'>18</td><td class='o-right'>right</td>" in row
    assert "<td class='t answer-b'>19</td><td class='o-wrong'>wrong</td>" in row
    # the McNemar figures beside them, as `evalctl compare` computes them
    cli = json.loads(evalctl("compare", a["run_id"], b["run_id"], "--json").stdout.splitlines()[-1])
    assert cli["flips"] == {"right_in_a_only": a_only, "right_in_b_only": b_only}
    p = paired.mcnemar_exact(4, 6)
    assert cli["mcnemar"]["p_value"] == pytest.approx(p, abs=1e-6)
    stats = page[page.index("id='mcnemar'") :].split("</table>", 1)[0]
    assert "<td>right in A only (B got worse)</td><td>4</td>" in stats
    assert "<td>right in B only (B got better)</td><td>6</td>" in stats
    assert f"<td>McNemar exact p</td><td>{p:.4g}</td>" in stats
    ci = cli["accuracy"]["ci"]
    assert f"CI {ci[0]:+.1%} .. {ci[1]:+.1%}" in stats  # the same bootstrap on both sides
    # every item with kind=all, flipped first
    status, _, everything = http_get(f"{AGGREGATOR}/compare/{a['run_id']}/{b['run_id']}?kind=all")
    ranks = re.findall(r"<tr class='pair rank-(\d)' data-item='([^']*)'>", everything)
    assert [i for _, i in ranks[:10]] == a_only + b_only and len(ranks) == 20
    # evalctl compare --html writes the same list
    out = tmp_path / "compare.html"
    evalctl("compare", a["run_id"], b["run_id"], "--html", str(out))
    written = out.read_text()
    assert re.findall(r"<tr class='pair rank-(\d)' data-item='([^']*)'>", written) == listed
    assert "<td>McNemar exact p</td>" in written and "Content-Security-Policy" in written
