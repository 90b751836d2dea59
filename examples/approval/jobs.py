"""The approval example's job queue: a directory of job files, with an adapter over the public fleet core.

No broker to install: a job is a small JSON file (task, id, arguments), written whole and renamed into
`queue/`, and a worker claims it by renaming it out. The adapter is the one docs/fleet.md ("Writing an
adapter") describes, for a queue of our own: one `Fleet` for the app with how to send a task again (write
its job file), each job run through `Fleet.run` in its execution, journal errors turned into a job put
back, and the sweep beside the worker. The fleet core gives the rest: the key `refund:<order>`, a run that
ends waiting ends its job, `resolve(..., dispatch=True)` and the sweep send a decided one on, and a job
lost with a killed worker is sent again from what its execution recorded.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic_ai_durable import DiskJournal, DurableError
from pydantic_ai_durable.fleet import Delivery, Fleet, fleet_of, retry_after

DATA = Path(os.environ.get('APPROVAL_DATA', 'approval-data'))
"""The example's state: `journal/`, `queue/`, `claimed/` and `results/`."""

ENGINE = 'directory'

_F = TypeVar('_F', bound=Callable[..., Awaitable[Any]])


def journal() -> DiskJournal:
    return DiskJournal(DATA / 'journal')


class DirectoryQueue:
    """The app: jobs in `queue/`, and the durable task functions a worker runs them with."""

    def __init__(self) -> None:
        self.functions: dict[str, Callable[..., Awaitable[Any]]] = {}
        self.fleet = fleet_of(self, ENGINE, lambda: Fleet(ENGINE, lambda delivery: self.put(delivery)))

    def task(self, name: str, *, resume_after: float) -> Callable[[_F], _F]:
        """Register a durable task under `name`, which `delay` takes."""

        def register(function: _F) -> _F:
            self.fleet.add(name, journal=journal(), lease_ttl=10.0, resume_after=resume_after)
            self.functions[name] = function
            return function

        return register

    def delay(self, task: str, task_id: str, *args: Any) -> str:
        """Send a task; returns its execution key."""
        delivery = self.fleet.delivery(task, task_id, args)
        self.put(delivery)
        return delivery.key

    def put(self, delivery: Delivery) -> None:
        """Write the job file (what the fleet calls to send a task again, under the same id)."""
        queue = DATA / 'queue'
        queue.mkdir(parents=True, exist_ok=True)
        draft = queue / f'.{uuid.uuid4().hex}.tmp'
        draft.write_text(json.dumps({'task': delivery.task, 'id': delivery.id, 'args': list(delivery.args)}))
        draft.rename(queue / f'{uuid.uuid4().hex}.json')

    def claim(self) -> Delivery | None:
        """The oldest job no other worker claimed, or `None`."""
        queue, claimed = DATA / 'queue', DATA / 'claimed'
        claimed.mkdir(parents=True, exist_ok=True)
        for path in sorted(queue.glob('*.json'), key=lambda p: p.stat().st_mtime) if queue.exists() else []:
            mine = claimed / f'{os.getpid()}-{path.name}'
            try:
                path.rename(mine)
            except FileNotFoundError:
                continue  # another worker took it
            job = json.loads(mine.read_text())
            mine.unlink()  # a worker killed from here on loses the job: the sweep sends it again
            return self.fleet.delivery(job['task'], job['id'], job['args'])
        return None

    async def run(self, delivery: Delivery) -> Any:
        """Run one job in its execution: its output, a `Waiting`, or `None` when it was put back for later."""
        function = self.functions[delivery.task]
        try:
            return await self.fleet.run(delivery, lambda: function(*delivery.args))
        except DurableError as error:
            if retry_after(error, attempt=0, lease_ttl=self.fleet.task(delivery.task).lease_ttl) is None:
                raise  # the task's own failure
            self.put(delivery)  # busy or failing journal: try again (a real queue waits `retry.delay` first)
            return None


def save_result(key: str, output: str) -> None:
    results = DATA / 'results'
    results.mkdir(parents=True, exist_ok=True)
    (results / f'{key}.json').write_text(json.dumps({'output': output}))


def result(key: str) -> str | None:
    path = DATA / 'results' / f'{key}.json'
    return json.loads(path.read_text())['output'] if path.exists() else None


app = DirectoryQueue()
