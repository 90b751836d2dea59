"""A process of the timer crash tests (TM): one attempt of an agent waiting on a file-backed batch.

`python timer_child.py JOURNAL_DIR BATCH_FILE LOG LATER [KILL_AT [SUSPEND_OVER]]`: runs the agent in
`execution('batch-1')` on a `DiskJournal`. Its sleeps wait no wall time: each is written to `LOG`
(`sleep <seconds>`) and moves this process's clock on by its length, and the clock starts `LATER` seconds after
the wall clock (the process runs that much later). With `KILL_AT`, the process SIGKILLs itself as its
`KILL_AT`-th sleep begins, inside the wait. With `SUSPEND_OVER`, a wait longer than that many seconds ends the
attempt (TM-4). It prints the run's output, or `waiting until <epoch seconds>` when the attempt ended at a long
wait.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from timer_batch import BatchFile, Sleeps, batch_agent

from pydantic_ai_durable import DiskJournal, ExecutionBusy, ExecutionWaiting, execution

KEY = 'batch-1'


def main() -> None:
    journal_dir, batch_file, log, later = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
    kill_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    suspend_over = float(sys.argv[6]) if len(sys.argv) > 6 else None
    sleeps = Sleeps(real=False)

    def on_sleep(seconds: float) -> None:
        with log.open('a') as f:
            f.write(f'sleep {seconds:.3f}\n')
        if len(sleeps.seconds) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    sleeps.on_sleep = on_sleep
    sleeps.install()
    try:
        from pydantic_ai_durable._steps import _timer
    except ImportError:  # the package before timers: nothing reads a clock
        pass
    else:
        _timer.clock = lambda: time.time() + later + sleeps.elapsed

    async def attempt() -> str:
        deadline = time.monotonic() + 60
        while True:
            journal = DiskJournal(journal_dir)
            try:
                agent = batch_agent(journal, BatchFile(batch_file), interval=60.0, suspend_waits_over=suspend_over)
                async with execution(KEY, journal=journal, lease_ttl=2.0):
                    result = await agent.run('summarise the report')
                return result.output
            except ExecutionWaiting as waiting:
                return f'waiting until {waiting.wakes_at}'
            except ExecutionBusy:  # pragma: no cover - a killed holder's lease, until it expires
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
            finally:
                await journal.close()

    print(asyncio.run(attempt()))


if __name__ == '__main__':
    main()
