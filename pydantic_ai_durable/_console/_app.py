"""What every route of the console shares: the journal, the settings, the templates and how requests are read.

Pages are rendered on the server from Jinja templates with autoescaping on, so every value that comes from
the journal (keys, model text, tool arguments, all attacker-controlled) reaches the browser as text; the only
script is `static/console.js`, which refreshes a running execution's page (UI-5). Static files ship in the
package: nothing is fetched from elsewhere.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

from ..journals import Journal
from ._access import ConsoleSettings, csrf_token, query_of
from ._actions import Refused, parse_json
from ._views import utc
from ._waiting import answer_template, questions

__all__ = ('Answer', 'Console', 'link')

_HERE = Path(__file__).parent


def link(path: str, **params: object) -> str:
    """`path?name=value...`, each value percent-encoded as UTF-8 (a key's lone surrogates included)."""
    parts = [
        f'{name}={quote(str(value).encode("utf-8", "surrogatepass"), safe="")}'
        for name, value in params.items()
        if value is not None and value != ''
    ]
    return f'{path}?{"&".join(parts)}' if parts else path


def _when(moment: float | None) -> str:
    text = utc(moment)
    if text is None:
        return '-'
    return text.replace('T', ' ')[:19] + ' UTC' if text.endswith('Z') else text  # else beyond the calendar


def _seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return '-'
    if value < 1:
        return f'{value * 1000:.0f} ms'
    if value < 120:
        return f'{value:.1f} s'
    return f'{value / 60:.1f} min'


def _size(count: int | None) -> str:
    if count is None:
        return '-'
    if count < 1000:
        return f'{count} B'
    value, unit = float(count) / 1000, 'KB'
    for bigger in ('MB', 'GB'):
        if value < 999.95:
            break
        value, unit = value / 1000, bigger
    return f'{value:.1f} {unit}'


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _compact(value: Any) -> str:
    """A tool's arguments or metadata: a text as it is, JSON on one line when short, indented when not."""
    return value if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    """A JSON value as JSON, a text in quotes (a tool's result: `"delivered"` is not `delivered`)."""
    line = json.dumps(value, ensure_ascii=False, default=str)
    return line if len(line) <= 100 else json.dumps(value, indent=2, ensure_ascii=False, default=str)


class Answer(JSONResponse):
    """A JSON answer as `--json` prints one: ASCII only, so any key (lone surrogates included) goes through."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(',', ':')).encode('ascii')


class Console:
    """The journal the console serves, its settings and its templates; the routes read everything from here."""

    def __init__(self, journal: Journal, settings: ConsoleSettings) -> None:
        self.journal = journal
        self.settings = settings
        self.templates = Environment(
            loader=FileSystemLoader(_HERE / 'templates'),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.globals.update(link=link, settings=settings)
        self.templates.filters.update(
            when=_when,
            seconds=_seconds,
            size=_size,
            pretty=_pretty,
            json=_json,
            compact=_compact,
            questions=questions,
            answer_template=answer_template,
        )

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        csrf = csrf_token(self.settings)
        text = self.templates.get_template(name).render(request=request, csrf=csrf, now=time.time(), **context)
        # A key may hold a lone surrogate, which UTF-8 cannot carry: it is shown escaped, never dropped.
        return HTMLResponse(text.encode('utf-8', 'backslashreplace'), status)

    def message(self, request: Request, title: str, text: str, status: int) -> HTMLResponse:
        return self.render(request, 'message.html', status, title=title, text=text)

    @staticmethod
    def static_directory() -> Path:
        return _HERE / 'static'

    @staticmethod
    def query(request: Request) -> dict[str, str]:
        return query_of(request.scope.get('query_string', b''))

    @staticmethod
    async def form(request: Request) -> dict[str, str]:
        """A URL-encoded form (the pages' forms) or a JSON object (the API's actions), as strings.

        A body that is neither (JSON nested too deep, a form that is not UTF-8) is refused with 400 (UI-10).
        """
        body = await request.body()
        if request.headers.get('content-type', '').startswith('application/json'):
            try:
                value = parse_json(body)
            except ValueError as exc:
                raise Refused(f'The body is not JSON: {exc}.', 400) from None
            return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
        try:
            return query_of(body)
        except ValueError:
            raise Refused('The form is not UTF-8: percent-encode every value as UTF-8.', 400) from None
