"""A process of the waiting crash tests (WT): one attempt of the app, or one `resolve`, killed where asked.

`python waiting_child.py JOURNAL LOG PHASE [POINT]`: `JOURNAL` is `disk:<dir>` or `postgres:<schema>:<dsn>`;
`PHASE` is `run` (the app's code, once) or `resolve` (approve call c2 as `killed-resolver`). `POINT` is where
the process SIGKILLs itself: for `run`, `after-run` (the deferral recorded, the scope not ended), `start`
(inside the scope, before the agent runs), or a point of `waiting_agent.build` (`refund`, `model-2`); for
`resolve`, `before-write` or `after-write` of the execution record. An attempt that meets the lease a killed
process left behind (PostgreSQL cannot prove it dead) waits for it to expire and tries again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fleet_agent import journal_from_setting as open_journal
from waiting_agent import KEY, PROMPT, build

from pydantic_ai_durable import ExecutionBusy, Journal, execution, resolve


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def attempt(journal: Journal, log: Path, point: str) -> Any:
    agent = build(journal, log, kill=frozenset({point}))
    async with execution(KEY, journal=journal, lease_ttl=2.0):
        if point == 'start':
            die()
        result = await agent.run(PROMPT)
        if point == 'after-run':
            die()
    return result.output


async def decide(journal: Journal, point: str) -> Any:
    write = journal.write_execution

    async def killing_write(key: str, value: dict[str, Any], *, epoch: int) -> bool:
        if point == 'before-write':
            die()
        written = await write(key, value, epoch=epoch)
        if point == 'after-write':
            die()
        return written

    journal.write_execution = killing_write  # type: ignore[method-assign]
    return await resolve(journal, KEY, approvals={'c2': True}, by='killed-resolver', wait=30)


async def main() -> None:
    setting, log, phase = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    point = sys.argv[4] if len(sys.argv) > 4 else ''
    deadline = time.monotonic() + 60
    while True:
        journal = open_journal(setting)
        try:
            outcome = await (attempt(journal, log, point) if phase == 'run' else decide(journal, point))
        except ExecutionBusy:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)  # a killed holder's lease, on PostgreSQL, until it expires
            continue
        finally:
            await journal.close()
        print(repr(outcome))
        return


if __name__ == '__main__':
    asyncio.run(main())
