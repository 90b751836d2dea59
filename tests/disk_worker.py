"""A process that works on a DiskJournal beside others: what the disk journal's lock tests run (J-9).

`python disk_worker.py record DIR KEY` records one execution of the two-step agent and exits.

`python disk_worker.py forked DIR GATE` records `parent` with a connection in a second, live thread, forks a
child that records `child` (then says so: `GATE/child`), and exits. The child waits for `GATE/go`, lists the
journal three times, through its journal and a new one, and writes what it saw to `GATE/result`.

`python disk_worker.py churn DIR NAME SECONDS GATE OTHER...` says it is ready (the file `GATE/NAME`), waits
for the file `GATE/go`, then for SECONDS records, forks, exports and imports executions, writes its own
counter (the metadata of the execution `tick/NAME`) after each round and checks that the counters of the
OTHER workers it reads never go back. It prints one JSON line: the keys it made, the errors it met, its
rounds and how many counters it read. Everything goes through the public API.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from helpers import Calls, two_step_agent

from pydantic_ai_durable import (
    DiskJournal,
    Journal,
    execution,
    export_execution,
    fork_execution,
    import_execution,
)

TICK = 'tick/'
"""Key prefix of the executions whose metadata holds a worker's counter."""


async def record(journal: Journal, key: str) -> None:
    """One execution of the two-step agent, recorded (or replayed, if it exists) to the end."""
    async with execution(key, journal=journal):
        await two_step_agent(None, Calls()).run('go')


async def tick(journal: Journal, name: str, count: int) -> None:
    """Store `count` as this worker's counter: the metadata of its tick execution (FN-4)."""
    async with execution(f'{TICK}{name}', journal=journal, metadata={'count': count}):
        pass


async def read_ticks(journal: Journal, names: list[str], seen: dict[str, int]) -> list[str]:
    """Read the other workers' counters; a value below one read before is an error (a read that went back)."""
    errors: list[str] = []
    for name in names:
        record = await journal.read_execution(f'{TICK}{name}')
        metadata = (record or {}).get('metadata') or {}
        count = metadata.get('count', -1)
        if count < seen.get(name, -1):
            errors.append(f'the counter of {name} went back from {seen[name]} to {count}')
        seen[name] = max(seen.get(name, -1), count)
    return errors


async def churn(directory: str, name: str, seconds: float, gate: Path, others: list[str]) -> dict[str, Any]:
    journal = DiskJournal(directory)
    (gate / name).touch()
    while not (gate / 'go').exists():  # every process starts together, after its imports
        await asyncio.sleep(0.01)
    keys: list[str] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    reads = 0
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        base = f'{name}/{rounds}'
        try:
            await record(journal, base)
            keys.append(base)
            if rounds % 2 == 0:  # a fork of a finished execution, run to its end: replays one step, records the rest
                await fork_execution(journal, base, f'{base}/fork', at=random.choice((1, 2)))
                await record(journal, f'{base}/fork')
                keys.append(f'{base}/fork')
            else:  # an export imported under a new key, through a journal object of its own
                document = await export_execution(journal, base)
                other = DiskJournal(directory)
                try:
                    await import_execution(other, document, key=f'{base}/copy')
                finally:
                    await other.close()
                keys.append(f'{base}/copy')
            await tick(journal, name, rounds)
            errors += await read_ticks(journal, others, seen)
            reads += len(others)
            if rounds % 5 == 0:  # this process's last connection closes, as a command of the CLI's does
                await journal.close()
                journal = DiskJournal(directory)
        except Exception:
            errors.append(traceback.format_exc())
            if len(errors) > 20:
                break
    await journal.close()
    return {'keys': keys, 'errors': errors, 'reads': reads, 'rounds': rounds}


def forked(directory: str, gate: Path) -> None:
    journal = DiskJournal(directory)
    asyncio.run(record(journal, 'parent'))
    ready, stop = threading.Event(), threading.Event()

    def reader() -> None:  # a connection of another thread, alive when the process forks
        asyncio.run(journal.list_executions())
        ready.set()
        stop.wait()

    threading.Thread(target=reader, daemon=True).start()
    ready.wait()
    if os.fork() != 0:
        while not (gate / 'child').exists():
            time.sleep(0.01)
        os._exit(0)  # the parent goes, its connections with it
    seen: list[Any] = []
    try:
        mine = DiskJournal(directory)
        asyncio.run(record(mine, 'child'))
        (gate / 'child').touch()
        while not (gate / 'go').exists():
            time.sleep(0.01)
        for _ in range(3):
            for reading in (mine, DiskJournal(directory)):
                seen.append(sorted(info.key for info in asyncio.run(reading.list_executions())))
    except Exception as exc:
        seen.append(f'{type(exc).__name__}: {exc}')
    finally:
        (gate / 'result').write_text(json.dumps(seen))
        os._exit(0)


def main() -> None:
    command, directory = sys.argv[1], sys.argv[2]
    if command == 'forked':
        forked(directory, Path(sys.argv[3]))
        return
    if command == 'record':
        journal = DiskJournal(directory)
        asyncio.run(record(journal, sys.argv[3]))
        asyncio.run(journal.close())
        return
    name, seconds, gate, others = sys.argv[3], float(sys.argv[4]), Path(sys.argv[5]), sys.argv[6:]
    print(json.dumps(asyncio.run(churn(directory, name, seconds, gate, others))))


if __name__ == '__main__':
    main()
