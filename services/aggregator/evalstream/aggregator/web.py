"""The aggregator's HTML pages, read from PostgreSQL on each request:

    GET /runs/<run>/report.html                     the run's report (first page of items)
    GET /runs/<run>/items?outcome=&category=&served_by=&q=&after=
                                                    the item browser, a page at a time
    GET /runs/<run>/items/<item>                    one item whole
    GET /runs/<run>/items/<item>/response.txt       its answer as plain text
    GET /compare/<run_a>/<run_b>?kind=&after=       two runs side by side, flipped items first

Every response carries a Content-Security-Policy that allows no script (model output is
hostile text), nosniff, no referrer and no framing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import asyncpg
from faststream.asgi import AsgiResponse

from evalstream.common.analysis import compare_html, items, items_html, pages, queries, report_html
from evalstream.common.analysis.reports import summarise

log = logging.getLogger("evalstream.aggregator.web")
MAX_PATH_CHARS = 2_000
MAX_QUERY_FIELDS = 20

PoolGetter = Callable[[], asyncpg.Pool]
Route = Callable[[Any, Any, Any], Any]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _headers(content_type: str, csp: str) -> dict[str, str]:
    return {
        "content-type": content_type,
        "content-security-policy": csp,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "x-frame-options": "DENY",
        "cache-control": "no-store",
    }


def _html(page: str, csp: str = pages.CSP_HEADER) -> AsgiResponse:
    return AsgiResponse(page.encode(), 200, _headers("text/html; charset=utf-8", csp))


def _query(scope: Any) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    if len(raw) > MAX_PATH_CHARS:
        raise HttpError(400, "query string too long")
    try:
        params = dict(urllib.parse.parse_qsl(raw, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS))
    except ValueError as exc:  # more fields than that
        raise HttpError(400, f"at most {MAX_QUERY_FIELDS} query fields") from exc
    if any("\x00" in k or "\x00" in v for k, v in params.items()):
        raise HttpError(400, "a query field holds a NUL character")
    return params


# The aggregates of a completed run's report (summary, histograms, timeline, failures) read
# every result: kept per (run, last write), so that a 150,000-item report costs them once
# and later loads only read the page of items. A write to the run (a redrive) changes the
# key. Bounded: reports of runs read long ago are computed again.
REPORT_CACHE_RUNS = 32
_report_cache: OrderedDict[tuple[str, datetime], report_html.ReportData] = OrderedDict()


async def report(pool: asyncpg.Pool, run_id: str) -> AsgiResponse:
    row = await queries.run(pool, run_id, "status, summary, updated_at")
    if row is None:
        raise KeyError(run_id)
    key = (run_id, row["updated_at"])
    cached = _report_cache.get(key) if row["status"] == "completed" else None
    if cached is None:
        summary = None
        if row["status"] == "completed" and row["summary"] is not None:  # stored at completion
            stored = row["summary"]
            summary = dict(json.loads(stored) if isinstance(stored, str) else stored)
        data = await report_html.collect(pool, run_id, summary or await summarise(pool, run_id), live=True)
        if row["status"] == "completed":
            _report_cache[key] = data
            while len(_report_cache) > REPORT_CACHE_RUNS:
                _report_cache.popitem(last=False)
    else:
        _report_cache.move_to_end(key)
        # the items part is always read now: one page, from the indexes
        data = dataclasses.replace(
            cached,
            items=await items.item_page(pool, run_id),
            facets=await items.facets(pool, run_id),
        )
    return _html(report_html.render(data), report_html.CSP_HEADER)


async def item_list(pool: asyncpg.Pool, run_id: str, params: dict[str, str]) -> AsgiResponse:
    run = await queries.run(pool, run_id, "status, model, total")
    if run is None:
        raise KeyError(run_id)
    try:
        flt = items.ItemFilter.from_query(params)
        limit = int(params.get("limit") or items.PAGE_SIZE)
        if not 1 <= limit <= items.MAX_PAGE_SIZE:
            raise ValueError(f"limit must be in 1..{items.MAX_PAGE_SIZE}")
        page = await items.item_page(pool, run_id, flt, after=params.get("after") or None, limit=limit)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from exc
    line = f"model {run['model']} · {run['status']} · {run['total'] or 0} items"
    return _html(items_html.items_page(page, await items.facets(pool, run_id), line))


async def one_item(pool: asyncpg.Pool, run_id: str, item_id: str, *, as_text: bool) -> AsgiResponse:
    item = await items.one_item(pool, run_id, item_id)
    if item is None:
        raise KeyError(item_id)
    if as_text:
        body = (item.get("response") or "").encode()
        return AsgiResponse(body, 200, _headers("text/plain; charset=utf-8", pages.TEXT_CSP_HEADER))
    return _html(items_html.item_page(run_id, item))


async def compare(pool: asyncpg.Pool, run_a: str, run_b: str, params: dict[str, str]) -> AsgiResponse:
    runs = {r["run_id"]: r for r in await queries.runs(pool, [run_a, run_b], "run_id, model, status")}
    for run_id in (run_a, run_b):
        if run_id not in runs:
            raise KeyError(run_id)
    try:
        page = await items.compare_page(
            pool, run_a, run_b, kind=params.get("kind") or "flipped", after=params.get("after") or None
        )
    except ValueError as exc:
        raise HttpError(400, str(exc)) from exc
    labels = [f"{r} ({runs[r]['model']}, {runs[r]['status']})" for r in (run_a, run_b)]
    return _html(compare_html.compare_document(page, labels, live=True))


def path_parts(scope: Any) -> list[str]:
    """The request path's segments, each decoded: split before decoding, since an item id
    may hold an encoded "/"."""
    raw = scope.get("raw_path") or urllib.parse.quote(scope["path"]).encode()
    path = raw.decode("latin-1").split("?", 1)[0]
    if len(path) > MAX_PATH_CHARS:
        raise HttpError(400, "path too long")
    return [urllib.parse.unquote(p) for p in path.split("/")[1:]]


async def dispatch(pool: asyncpg.Pool, scope: Any) -> AsgiResponse:
    parts = path_parts(scope)
    params = _query(scope)
    match parts:
        case ["runs", run_id, "report.html"]:
            return await report(pool, run_id)
        case ["runs", run_id, "items"] | ["runs", run_id, "items", ""]:
            return await item_list(pool, run_id, params)
        case ["runs", run_id, "items", item_id]:
            return await one_item(pool, run_id, item_id, as_text=False)
        case ["runs", run_id, "items", item_id, "response.txt"]:
            return await one_item(pool, run_id, item_id, as_text=True)
        case ["compare", run_a, run_b]:
            return await compare(pool, run_a, run_b, params)
    raise HttpError(404, "not found")


def routes(pool: PoolGetter) -> Sequence[tuple[str, Route]]:
    """The prefix routes to mount on the service's ASGI app."""

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        try:
            if scope["method"] not in ("GET", "HEAD"):
                raise HttpError(405, "only GET and HEAD")
            response = await dispatch(pool(), scope)
        except HttpError as exc:
            response = _error(exc.status, str(exc))
        except KeyError as exc:
            response = _error(404, f"no such run or item: {exc.args[0] if exc.args else ''}")
        except (ValueError, asyncpg.DataError) as exc:  # the request's values, not the service
            response = _error(400, f"bad request: {str(exc)[:200]}")
        except (TimeoutError, asyncpg.PostgresError, OSError) as exc:
            log.warning("page %s failed: %s", scope["path"][:200], exc)
            response = _error(503, "the database did not answer in time; try again")
        await response(scope, receive, send)

    return [("/runs/", serve), ("/compare/", serve)]


def _error(status: int, message: str) -> AsgiResponse:
    return AsgiResponse(
        pages.error_page(status, message).encode(),
        status,
        _headers("text/html; charset=utf-8", pages.CSP_HEADER),
    )
