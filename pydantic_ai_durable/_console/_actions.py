"""What the console changes: export, fork and delete, through the functions the CLI calls, fenced alike (UI-3).

Export and fork are the journal core's `export_execution` and `fork_execution` (XP-1, XP-3); delete is
`delete_under_lease`, which takes the execution's lease first so the attempt that held it can write
nothing more (B-13), and refuses a running execution as `delete` without `--force` does. A refusal a user
can act on comes back as `Refused`, shown on the page or in the API's answer; nothing here bypasses a lease.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._core import export_execution, fork_execution
from .._errors import DurableError
from ..journals import Journal, delete_under_lease

__all__ = ('Refused', 'delete', 'export', 'file_name', 'fork')

_SAFE_NAME = re.compile(r'[^A-Za-z0-9._-]+')


class Refused(Exception):
    """An action the journal refused, with the reason in plain words and the HTTP status that says so."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def _refusing(exc: BaseException) -> Refused:
    return Refused(' '.join(str(exc).strip('\'"').split()), 404 if isinstance(exc, LookupError) else 409)


async def export(journal: Journal, key: str) -> bytes:
    """The export file of `key` (`export KEY`): sealed payloads stay sealed, the file holds no more than the journal."""
    try:
        document = await export_execution(journal, key, plaintext=False)
    except (DurableError, LookupError, ValueError) as exc:
        raise _refusing(exc) from None
    return (json.dumps(document, ensure_ascii=True, separators=(',', ':')) + '\n').encode('ascii')


def file_name(key: str) -> str:
    """A download name for an export: the key's safe characters, never a path or a header's syntax."""
    cleaned = _SAFE_NAME.sub('_', key).strip('._')[:80]
    return f'{cleaned or "execution"}.json'


async def fork(journal: Journal, key: str, new_key: str, run: str, at: int) -> dict[str, Any]:
    """`fork KEY NEW_KEY --at RUN:STEP`: the steps before `at` replay under `new_key`, the rest runs live."""
    if not new_key:
        raise Refused('The fork needs a key of its own.', 400)
    try:
        report = await fork_execution(journal, key, new_key, at=at, run=run)
    except (DurableError, LookupError, ValueError) as exc:
        raise _refusing(exc) from None
    return {'forked': key, 'into': report.key, 'run': run, 'at': at, 'runs': report.runs, 'steps': report.steps}


async def delete(journal: Journal, key: str) -> dict[str, Any]:
    """`delete KEY`: under the execution's lease, and never a running execution."""
    page = await journal.page_executions(key=key, limit=1)
    if not page.executions and await journal.read_execution(key) is None:
        raise Refused(f'No execution {key!r} in the journal.', 404)
    state = page.executions[0].state if page.executions else 'interrupted'
    running = Refused(
        f'Execution {key!r} is running: an attempt holds its lease and the journal cannot prove its process dead. '
        'Stop it first; the console never deletes a running execution (the CLI does, with --force).'
    )
    if state == 'running':
        raise running
    try:
        await journal.open()
        if await delete_under_lease(journal, key, force=False) is not None:
            raise running
    except DurableError as exc:
        raise _refusing(exc) from None
    return {'deleted': key, 'state': state}
