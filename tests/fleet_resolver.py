"""A web handler's resolve, killed after its decision is written and before it sends the task on (WT-4).

`python fleet_resolver.py ENGINE KEY CALL_ID HELD`, in a worker's environment (`FLEET_JOURNAL` and the
engine's settings): it imports the app that defines the durable tasks, as a web app does, so the fleet
core's `redispatch` is this process's dispatcher; then it approves the call with `dispatch=True`. The
dispatcher is wrapped to write `HELD` and wait there for good, before sending, so the test SIGKILLs the
process between the write and the send.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

from fleet_agent import journal_from_environment

from pydantic_ai_durable import Journal, resolve, set_dispatcher


async def main() -> None:
    engine, key, call_id, held = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    importlib.import_module(f'fleet_{engine}_app')  # the app's tasks, and with them its fleet
    send = set_dispatcher(None)
    assert send is not None, 'importing the app did not load the fleet core'

    async def held_before_sending(journal: Journal, key: str) -> None:
        held.write_text(key)  # the decision is written: the resolver's lease is released by now
        await asyncio.sleep(3600)
        await send(journal, key)

    set_dispatcher(held_before_sending)
    await resolve(journal_from_environment(), key, approvals={call_id: True}, by='killed-resolver', dispatch=True)


if __name__ == '__main__':
    asyncio.run(main())
