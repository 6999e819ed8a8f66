"""What every HTML page of the read side shares: the one escaper, the head with its
Content-Security-Policy, links, and the cells both the item browser and the compare page draw.

Model output is hostile text. Every value goes through `escape` and lands in text nodes or
quoted attributes only; nothing a model wrote ever becomes markup, a link, a URL or a style.
Behind that, every page carries a Content-Security-Policy that allows no script at all, no
fetch, no frame and only the page's own stylesheet (by hash), so that even a rendering bug
could not run anything.
"""

from __future__ import annotations

import base64
import hashlib
import html
import urllib.parse
from collections.abc import Mapping
from typing import Any

from evalstream.common.analysis.items import OUTCOME_NAMES

# Everything a page may load. No script-src: default-src 'none' forbids every script.
_POLICY = "default-src 'none'; style-src {styles}; img-src data:; form-action 'self'; base-uri 'none'"
# Only honoured as an HTTP header (a <meta> policy cannot say it)
HEADER_ONLY_POLICY = "; frame-ancestors 'none'"

TABLE_CSS = """
.items td,.items th{font-size:12px}.items td.t{font-family:ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;max-width:320px}
.o-failed{color:#a11;font-weight:600}.o-wrong{color:#b54708;font-weight:600}.o-right{color:#276738}.o-ungraded{color:#555}
.more{color:#888;font-style:italic}form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:8px 0 12px;font-size:13px}
form.filters label{display:flex;flex-direction:column;gap:2px}pre.t{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;border:1px solid #e3e3e3;padding:8px;font-size:12px;max-height:none}
.pager{margin:10px 0;font-size:13px}.flag{background:#fde7c4;border-radius:3px;padding:0 4px;font-size:11px}
details.item summary{cursor:pointer}.stats td:first-child{color:#666;width:260px}
"""
BASE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px}table{border-collapse:collapse;font-size:13px;width:100%}
td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left;vertical-align:top}.meta td:first-child{color:#666;width:180px}
"""
CSS = BASE_CSS + TABLE_CSS


def style_hash(css: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(css.encode()).digest()).decode() + "'"


def content_security_policy(*styles: str, header: bool = False) -> str:
    """The policy for a page whose only <style> blocks are `styles`."""
    policy = _POLICY.format(styles=" ".join(style_hash(s) for s in styles))
    return policy + (HEADER_ONLY_POLICY if header else "")


CSP = content_security_policy(CSS)
CSP_HEADER = content_security_policy(CSS, header=True)
# For text served as is (an answer as text/plain): nothing at all, and a sandbox.
TEXT_CSP_HEADER = "default-src 'none'; sandbox; frame-ancestors 'none'"


def escape(value: Any, *, none: str = "") -> str:
    """`value` as text for a text node or a quoted attribute. None reads as `none`: nothing on
    the item and compare pages; the run report (report_html) has always printed "None"."""
    return html.escape(none if value is None else str(value), quote=True)


def head(title: str, css: str, csp: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{escape(csp)}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{escape(title)}</title><style>{css}</style></head>\n"
    )


def page(title: str, body: str) -> str:
    return head(title, CSS, CSP) + f"<body>\n{body}\n</body></html>\n"


def q(value: str) -> str:
    """A path segment (an item or run id may hold any character)."""
    return urllib.parse.quote(value, safe="")


def href(path: str, params: Mapping[str, str] | None = None) -> str:
    query = urllib.parse.urlencode(params or {})
    return escape(path + (f"?{query}" if query else ""))


def clip_cell(row: Mapping[str, Any], column: str) -> str:
    """A table cell's text: the head the query read, and how much more there is."""
    text = row.get(column)
    if text is None:
        return ""
    total = row.get(f"{column}_chars") or len(text)
    more = f"<span class='more'> … +{total - len(text)} chars</span>" if total > len(text) else ""
    return escape(text) + more


def outcome_name(row: Mapping[str, Any]) -> str:
    return OUTCOME_NAMES.get(row.get("outcome"), "?")  # type: ignore[arg-type]


def pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None else "n/a"


def error_page(status: int, message: str) -> str:
    return page(f"{status}", f"<h1>{status}</h1><p>{escape(message)}</p>")
