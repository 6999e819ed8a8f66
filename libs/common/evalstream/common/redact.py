"""Secrets out of text that may be printed: the password of a URL's user info
(postgresql://evalstream:PASSWORD@host/db, as DATABASE_URL carries it) and `password=`
values of key-value strings (libpq DSNs, JAAS lines). Logs (logs.JsonFormatter) and evalctl's
error messages pass through it."""

from __future__ import annotations

import re

MASK = "***"

# scheme://user:password@  (bounded: user info never spans whitespace, '/', or '@')
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,30}://[^:/@\s]{0,256}:)[^@\s/]{1,1024}(?=@)")
# password=value, password="value", password='value' (libpq DSNs, JAAS, properties)
_KEY_PASSWORD = re.compile(
    r"(?P<head>\b(?:password|passwd|sasl_plain_password)\s{0,4}[=:]\s{0,4})"
    r"(?:\"[^\"]{0,1024}\"|'[^']{0,1024}'|[^\s,;&\"']{1,1024})",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """`text` with every URL password and `password=` value replaced by ***."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    return _KEY_PASSWORD.sub(lambda m: m.group("head") + MASK, text)


def redact_url(url: str) -> str:
    """A URL fit to print: its password (if any) replaced by ***."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, url)
