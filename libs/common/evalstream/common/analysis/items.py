"""Reading item results a page at a time, for the report's item browser and the compare
page (the aggregator serves them; `evalctl report --html` and `evalctl compare --html`
write the same pages to files).

Every query reads one page by keyset: rows come ordered by (outcome, item_id), wrong and
failed items first, and the next page starts after the last row's key, so that page 3,000
of a 150,000-item run costs what page 1 does. Filters on outcome, category and served_by
are served by the indexes of migration 004; the text search scans one run's rows only
(bounded by QUERY_TIMEOUT_S). Table rows carry clipped text (left() in SQL), so a page
never moves whole answers; one item is read whole on its own.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evalstream.common.analysis import paired, queries
from evalstream.common.analysis.queries import Conn

# item_results.outcome (a generated column, migration 004), in the order pages list them
OUTCOMES = {"failed": 0, "wrong": 1, "ungraded": 2, "right": 3}
OUTCOME_NAMES = {rank: name for name, rank in OUTCOMES.items()}
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_FILE_ROWS = 10_000  # rows of a compare page written to a file (`evalctl compare --html`)
MAX_FILTER_CHARS = 200
MAX_CURSOR_CHARS = 2_000
COMPARE_KINDS = ("flipped", "changed", "all")


@dataclass(frozen=True)
class ItemFilter:
    outcome: str | None = None
    category: str | None = None
    served_by: str | None = None
    text: str | None = None

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> ItemFilter:
        """From a page's query parameters (outcome, category, served_by, q); empty means
        any. Raises ValueError for an unknown outcome or an oversized value."""
        values = {k: (params.get(k) or "").strip() or None for k in ("outcome", "category", "served_by")}
        values["q"] = (params.get("q") or "").replace("\x01", "").strip() or None
        for key, value in values.items():
            if value is not None and len(value) > MAX_FILTER_CHARS:
                raise ValueError(f"{key} is longer than {MAX_FILTER_CHARS} characters")
        if values["outcome"] is not None and values["outcome"] not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}")
        return cls(values["outcome"], values["category"], values["served_by"], values["q"])

    def query(self) -> dict[str, str]:
        """The filter as query parameters (for links to further pages)."""
        pairs = {
            "outcome": self.outcome,
            "category": self.category,
            "served_by": self.served_by,
            "q": self.text,
        }
        return {k: v for k, v in pairs.items() if v}

    def where(self, args: list[Any]) -> str:
        """SQL conditions (appending their parameters to `args`, whose first is run_id)."""
        out = []
        if self.outcome is not None:
            args.append(OUTCOMES[self.outcome])
            out.append(f"outcome = ${len(args)}")
        if self.category is not None:
            args.append(self.category)
            out.append(f"category = ${len(args)}")
        if self.served_by is not None:
            args.append(self.served_by)
            out.append(f"served_by = ${len(args)}")
        if self.text is not None:
            args.append("%" + like_escape(self.text) + "%")
            n = len(args)
            # one ILIKE over the fields joined (by a character no search can hold: it is
            # cut out of the search text) costs a fifth of five
            out.append(f"concat_ws(chr(1), item_id, question, response, extracted, error) ILIKE ${n}")
        return "".join(f" AND {c}" for c in out)


def like_escape(text: str) -> str:
    """`text` matched literally by LIKE (its default escape character is the backslash)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def encode_cursor(key: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, arity: int) -> list[Any] | None:
    """A page's `after` parameter back to its (rank, item_id) key; ValueError if forged."""
    if not cursor:
        return None
    if len(cursor) > MAX_CURSOR_CHARS:
        raise ValueError("cursor too long")
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise ValueError("bad cursor") from exc
    if not (
        isinstance(key, list)
        and len(key) == arity
        and isinstance(key[0], int)
        and not isinstance(key[0], bool)
        and -(2**31) <= key[0] < 2**31  # a rank the database's integers hold
        and all(isinstance(k, str) and "\x00" not in k for k in key[1:])
    ):
        raise ValueError("bad cursor")
    return key


@dataclass
class ItemPage:
    run_id: str
    filter: ItemFilter
    rows: list[dict[str, Any]]
    matching: int  # items that pass the filter, on every page (MAX_COUNTED + 1: more than that)
    next_after: str | None  # cursor of the next page, None on the last
    after: str | None = None  # cursor this page started after (None: the first page)
    full: bool = False  # rows carry every field whole
    limit: int = PAGE_SIZE


async def item_page(
    conn: Conn,
    run_id: str,
    flt: ItemFilter = ItemFilter(),
    *,
    after: str | None = None,
    limit: int = PAGE_SIZE,
    full: bool = False,
) -> ItemPage:
    """One page of a run's items, wrong and failed first. Raises ValueError for a bad cursor."""
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    key = decode_cursor(after, 2)
    args: list[Any] = [run_id]
    where = flt.where(args)
    count_args = list(args)
    if key is not None:
        args += key
        where += f" AND (outcome, item_id) > (${len(args) - 1}::smallint, ${len(args)})"
    args.append(limit + 1)
    rows = await queries.item_rows(conn, queries.FULL_COLUMNS if full else queries.ROW_COLUMNS, where, args)
    if flt == ItemFilter():  # every item: the run's result count, kept by the aggregator
        matching = await queries.recorded(conn, run_id)
    else:  # counted up to a cap, so that a broad filter does not scan the whole run
        matching = await queries.count_matching(conn, flt.where(count_args[:1]), count_args)
    page = [dict(r) for r in rows[:limit]]
    more = len(rows) > limit
    return ItemPage(
        run_id=run_id,
        filter=flt,
        rows=page,
        matching=int(matching or 0),
        next_after=encode_cursor([page[-1]["outcome"], page[-1]["item_id"]]) if more else None,
        after=after,
        full=full,
        limit=limit,
    )


async def one_item(conn: Conn, run_id: str, item_id: str) -> dict[str, Any] | None:
    row = await queries.one_item(conn, run_id, item_id)
    return dict(row) if row is not None else None


async def facets(conn: Conn, run_id: str) -> dict[str, list[str]]:
    """The categories and served_by values of a run (the filter form's choices)."""
    out: dict[str, list[str]] = {}
    for column in ("category", "served_by"):
        rows = await queries.distinct_values(conn, run_id, column)
        out[column] = [r["x"] for r in rows if r["x"] != ""]
    return out


# --------------------------------------------------------------------------- two runs

_KIND_MAX_RANK = {"flipped": 1, "changed": 2, "all": 3}


@dataclass
class ComparePage:
    run_a: str
    run_b: str
    kind: str
    stats: dict[str, Any]  # the shape of `evalctl compare --json`'s figures
    rows: list[dict[str, Any]] = field(default_factory=list)
    next_after: str | None = None
    after: str | None = None


async def compare_stats(
    conn: Conn,
    run_a: str,
    run_b: str,
    *,
    resamples: int = paired.BOOTSTRAP_RESAMPLES,
    seed: int = paired.BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """Counts, accuracies on the common items, McNemar and the paired bootstrap interval,
    aggregated in PostgreSQL (the bootstrap from the histogram of per-item differences)."""
    t = await queries.pair_totals(conn, run_a, run_b)
    sizes = await queries.result_counts(conn, [run_a, run_b])
    diffs = await queries.score_differences(conn, run_a, run_b)
    common = int(t["common"])
    acc_a = t["a_sum"] / common if common else None
    acc_b = t["b_sum"] / common if common else None
    ci = paired.bootstrap_ci_from_counts(diffs, resamples=resamples, seed=seed)
    return {
        "items": {"a": sizes.get(run_a, 0), "b": sizes.get(run_b, 0), "common": common},
        "identical_responses": int(t["identical"]),
        **paired.figures(
            acc_a, acc_b, ci, int(t["a_only"]), int(t["b_only"]), resamples=resamples, seed=seed
        ),
    }


async def compare_page(
    conn: Conn,
    run_a: str,
    run_b: str,
    *,
    kind: str = "flipped",
    after: str | None = None,
    limit: int = PAGE_SIZE,
    stats: dict[str, Any] | None = None,
) -> ComparePage:
    """The items of two runs side by side, flipped ones first (right in A only, then right
    in B only), then (kind "changed"/"all") the other items whose answer changed, then
    (kind "all") the rest. Raises ValueError for an unknown kind or a bad cursor."""
    if kind not in _KIND_MAX_RANK:
        raise ValueError(f"kind must be one of {', '.join(COMPARE_KINDS)}")
    limit = max(1, min(limit, MAX_FILE_ROWS))
    key = decode_cursor(after, 2)
    rows = await queries.pair_rows(conn, run_a, run_b, _KIND_MAX_RANK[kind], key, limit + 1)
    page = [dict(r) for r in rows[:limit]]
    return ComparePage(
        run_a=run_a,
        run_b=run_b,
        kind=kind,
        stats=stats if stats is not None else await compare_stats(conn, run_a, run_b),
        rows=page,
        next_after=encode_cursor([page[-1]["rank"], page[-1]["item_id"]]) if len(rows) > limit else None,
        after=after,
    )
