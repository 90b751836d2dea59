"""PostgreSQL connection strings with the password hidden, for reprs, log lines and errors.

A password may hold `@`, `:`, `/`, spaces or quotes, and libpq itself cuts an unencoded URL password at
its first `@` (the rest becomes the host name), so neither a regular expression nor libpq's own parse
can tell where a password ends. This module hides whatever could be part of one instead: in a URL,
everything between the first `:` of the user part and the last `@`, and a `password` query parameter
with everything after it; in the keyword form, the value of each `password` keyword, quoted or not, or,
when the string cannot be split into keywords, everything from the first `password` on. Errors from
psycopg echo pieces of the connection string as libpq understood it, so `scrub` also hides every quoted
piece of an error text that overlaps a secret. Hiding too much is acceptable; showing a piece is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

__all__ = ('mask_dsn', 'scrub')

MASK = '***'
_URL_PREFIXES = ('postgresql://', 'postgres://')
_SPACE = ' \t\n\r\f\v'
"""What libpq skips between keywords (C `isspace` in the C locale)."""
_NOT_A_USER = set(':/?#&=[]')
_QUOTED = re.compile(r'(["\'])(.*?)\1', re.DOTALL)
_SHORTEST_REPLACED = 3
"""Secrets shorter than this are not replaced everywhere in a text (it would garble every word), only in quotes."""


@dataclass
class _Masked:
    shown: str
    secrets: list[str] = field(default_factory=list)


def mask_dsn(dsn: str) -> str:
    """`dsn` with every part that could belong to a password replaced by `***`."""
    return _mask(dsn).shown


def scrub(text: str, dsn: str) -> str:
    """`text` (an error message, a log line) without any piece of the password in `dsn`."""
    masked = _mask(dsn)
    if dsn and dsn in text:
        text = text.replace(dsn, masked.shown)
    secrets = _variants(masked.secrets, dsn)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _SHORTEST_REPLACED:
            text = text.replace(secret, MASK)
    return _QUOTED.sub(lambda m: m[1] + MASK + m[1] if _overlaps(m[2], secrets) else m[0], text)


def _mask(dsn: str) -> _Masked:
    stripped = dsn.lstrip()
    for prefix in _URL_PREFIXES:
        if stripped[: len(prefix)].lower() == prefix:
            start = len(dsn) - len(stripped) + len(prefix)
            return _mask_url(dsn[:start], dsn[start:])
    return _mask_keywords(dsn)


def _mask_url(head: str, rest: str) -> _Masked:
    """Mask a URL's password under both readings of an `@`: ending the user part, or inside the query."""
    spans: list[tuple[int, int]] = []
    at = rest.rfind('@')  # libpq stops at the first `@`; the password may hold more of them
    if at >= 0:
        colon = rest.find(':', 0, at)
        if colon >= 0 and not _NOT_A_USER & set(rest[:colon]):
            spans.append((colon + 1, at))
        elif _NOT_A_USER & set(rest[:at]):  # not a plain user name: it may hold a query's password
            spans.append((0, at))
    query = rest.find('?')
    if query >= 0:
        offset = query + 1
        for parameter in rest[query + 1 :].split('&'):
            key, equals, _ = parameter.partition('=')
            if equals and unquote(key).strip().lower() == 'password':
                spans.append((offset + len(key) + 1, len(rest)))  # to the end: `&` may be in the password
                break
            offset += len(parameter) + 1
    return _replace(head, rest, spans)


def _replace(head: str, text: str, spans: list[tuple[int, int]]) -> _Masked:
    """`head + text` with each of the (merged) `spans` of `text` replaced by the mask."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    masked = _Masked(head, [text[start:end] for start, end in spans + merged])
    last = 0
    for start, end in merged:
        masked.shown += text[last:start] + MASK
        last = end
    masked.shown += text[last:]
    return masked


def _mask_keywords(dsn: str) -> _Masked:
    """Mask `password=...` in libpq's `key=value` form, quoted (`'a \\' b'`) or not (`a\\ b`)."""
    spans = _password_spans(dsn)
    if spans is None:  # not a keyword list libpq would accept: hide everything from `password` on
        found = dsn.lower().find('password')
        if found < 0:
            return _Masked(dsn)
        return _Masked(f'{dsn[:found]}password={MASK}', [dsn[found:]])
    return _replace('', dsn, spans)


def _password_spans(text: str) -> list[tuple[int, int]] | None:
    """Where each `password` value lies in a keyword list, or `None` when it does not split into keywords."""
    spans: list[tuple[int, int]] = []
    i, end = 0, len(text)

    def skip_space(at: int) -> int:
        while at < end and text[at] in _SPACE:
            at += 1
        return at

    while (i := skip_space(i)) < end:
        start = i
        while i < end and text[i] != '=' and text[i] not in _SPACE:
            i += 1
        key = text[start:i]
        i = skip_space(i)
        if not key or i >= end or text[i] != '=':
            return None
        i = skip_space(i + 1)
        value = i
        if i < end and text[i] == "'":
            i += 1
            while i < end and text[i] != "'":
                i += 2 if text[i] == '\\' else 1
            if i >= end:
                return None  # unterminated quote
            i += 1
        else:
            while i < end and text[i] not in _SPACE:
                i += 2 if text[i] == '\\' else 1
        if key.lower() == 'password':
            spans.append((value, min(i, end)))
    return spans


def _variants(secrets: list[str], dsn: str) -> list[str]:
    """Each secret as written and as libpq may echo it: percent-decoded, unquoted, unescaped, parsed."""
    found: set[str] = set()
    for secret in secrets:
        inner = secret[1:-1] if len(secret) >= 2 and secret[0] == secret[-1] == "'" else secret
        found.update({secret, unquote(secret), inner, re.sub(r'\\(.)', r'\1', inner)})
    try:
        from psycopg.conninfo import conninfo_to_dict

        parsed = conninfo_to_dict(dsn).get('password')
    except Exception:
        parsed = None
    if isinstance(parsed, str):
        found.add(parsed)
    return [secret for secret in found if secret]


def _overlaps(piece: str, secrets: list[str]) -> bool:
    """Whether a quoted piece of an error text is, contains or shares three characters with a secret."""
    if not piece:
        return False
    for secret in secrets:
        if piece in secret:
            return True
        size = min(3, len(secret))
        if any(secret[i : i + size] in piece for i in range(len(secret) - size + 1)):
            return True
    return False
