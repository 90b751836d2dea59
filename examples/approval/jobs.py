"""Where the approval example keeps things, and its job queue: a directory of job files.

The queue stands in for Celery or Procrastinate (their durable tasks will go on after a wait by themselves,
with the fleet's own dispatch): a job is a small JSON file, written whole and renamed into `queue/`, and a
worker claims it by renaming it out. A job lost with a killed worker is not a problem: the worker's sweep
finds the interrupted execution and enqueues it again from the metadata its execution keeps.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from pydantic_ai_durable import DiskJournal

DATA = Path(os.environ.get('APPROVAL_DATA', 'approval-data'))
"""The example's state: `journal/`, `queue/`, `claimed/` and `results/`."""


def journal() -> DiskJournal:
    return DiskJournal(DATA / 'journal')


def key_of(order: str) -> str:
    return f'refund-{order}'


def enqueue(order: str, amount: int) -> str:
    """Ask a worker to run (or go on with) the refund of `order`; returns its execution key."""
    queue = DATA / 'queue'
    queue.mkdir(parents=True, exist_ok=True)
    job = {'key': key_of(order), 'order': order, 'amount': amount}
    draft = queue / f'.{uuid.uuid4().hex}.tmp'
    draft.write_text(json.dumps(job))
    draft.rename(queue / f'{uuid.uuid4().hex}.json')
    return job['key']


def claim() -> dict[str, Any] | None:
    """The oldest job no other worker claimed, or `None`."""
    queue, claimed = DATA / 'queue', DATA / 'claimed'
    claimed.mkdir(parents=True, exist_ok=True)
    for path in sorted(queue.glob('*.json'), key=lambda p: p.stat().st_mtime) if queue.exists() else []:
        mine = claimed / f'{os.getpid()}-{path.name}'
        try:
            path.rename(mine)
        except FileNotFoundError:
            continue  # another worker took it
        job: dict[str, Any] = json.loads(mine.read_text())
        mine.unlink()
        return job
    return None


def save_result(key: str, output: str) -> None:
    results = DATA / 'results'
    results.mkdir(parents=True, exist_ok=True)
    (results / f'{key}.json').write_text(json.dumps({'output': output}))


def result(key: str) -> str | None:
    path = DATA / 'results' / f'{key}.json'
    return json.loads(path.read_text())['output'] if path.exists() else None
