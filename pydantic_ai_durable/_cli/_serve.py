"""`serve`: the console in the browser over the journal, from the `console` extra.

The bind is checked before the journal is opened, so a console that would be reachable by others without a
token never starts; the journal is opened as every command opens it (never created) and closed when the
server stops.
"""

from __future__ import annotations

from .._errors import ConsoleRefused
from ._render import cell
from ._target import EXIT_OK, EXIT_USAGE, Failure, open_target
from ._waiting import default_resolver, import_tasks

__all__ = ('serve_command',)

_INSTALL = "the console needs the extra 'console': pip install 'pydantic-ai-durable-journal[console]'"


def serve_command(
    journal: str | None,
    schema: str | None,
    *,
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    by: str | None = None,
    dispatch: str | None = None,
) -> int:
    try:
        from .. import _console
    except ImportError as exc:
        raise Failure(f'{_INSTALL} ({exc})') from None
    if dispatch is not None:
        import_tasks(dispatch)
    try:
        chosen = _console.check_bind(host, token)
    except ConsoleRefused as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    target = open_target(journal, schema)
    settings = _console.ConsoleSettings(
        host=host,
        port=port,
        token=chosen,
        read_only=read_only,
        label=cell(target.label, 120),
        by=by if by is not None else default_resolver(),
        dispatch=dispatch is not None,
    )
    try:
        _console.serve(target.journal, settings)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise Failure(f'cannot serve on {host}:{port}: {exc.strerror or exc}') from None
    return EXIT_OK
