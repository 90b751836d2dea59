"""A process of the external-event tests (EV): one attempt of the app, killed where asked.

`python event_child.py JOURNAL_DIR LOG [POINT]`: runs the app's code once on a `DiskJournal` and prints its
output, or `waiting <ref>` when the run handed its token on. `POINT` `after-ask` SIGKILLs the process once the
`ask` step is recorded, before the attempt ends; `in-ask` inside `ask`, before it returns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from event_agent import KEY, PROMPT, build

from pydantic_ai_durable import DiskJournal, ExecutionWaiting, execution
from pydantic_ai_durable._core import STEP_OBSERVER


def kill_after_ask(step: Any, point: str) -> None:
    if step.name.startswith('external_event:') and point == 'after_record':
        os.kill(os.getpid(), signal.SIGKILL)


async def main() -> None:
    directory, log = sys.argv[1], Path(sys.argv[2])
    point = sys.argv[3] if len(sys.argv) > 3 else ''
    if point == 'after-ask':
        STEP_OBSERVER.set(kill_after_ask)
    journal = DiskJournal(directory)
    agent = build(journal, log, policy='kill' if point == 'in-ask' else 'hand-on')
    try:
        async with execution(KEY, journal=journal):
            result = await agent.run(PROMPT)
    except ExecutionWaiting as waiting:
        print(f'waiting {waiting.wait}')
        return
    print(repr(result.output))


if __name__ == '__main__':
    asyncio.run(main())
