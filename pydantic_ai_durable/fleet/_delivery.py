"""A delivery: one piece of work a queue hands a worker, and the metadata its execution records.

The execution key is the task's name and the id the queue keeps over retries and redeliveries. The
metadata holds everything needed to send the task again (the engine, the task, the id, its arguments and
queue), which is what the sweep and `redispatch` read back; the fields that name the work are fixed, so a
second delivery of the id with another task or other arguments is refused before it runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import DurableError

__all__ = ('FIXED_FIELDS', 'METADATA_BYTES', 'Delivery', 'execution_key')

FIXED_FIELDS = ('engine', 'task', 'id', 'args', 'kwargs')
"""The metadata fields a later delivery of the same execution must bring unchanged."""

METADATA_BYTES = 16 * 1024
"""The most bytes of JSON a delivery's metadata may take (the limit of an execution's metadata)."""


def execution_key(task: str, task_id: str | int) -> str:
    """The execution key of one task: its name and the id its queue keeps over retries (FL-1)."""
    return f'{task}:{task_id}'


@dataclass(frozen=True)
class Delivery:
    """One delivery of a durable task: which task, under which id, with which arguments, from which queue."""

    engine: str
    """The adapter's name (`"celery"`, `"procrastinate"`): which fleet can send the task again."""
    task: str
    id: str | int
    """The id the queue keeps over retries and redeliveries (a Celery task id, a Procrastinate job id)."""
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None

    @property
    def key(self) -> str:
        return execution_key(self.task, self.id)

    def metadata(self) -> dict[str, Any]:
        """What the execution records: JSON of at most 16 KiB, else `DurableError` before anything runs."""
        metadata = {
            'engine': self.engine,
            'task': self.task,
            'id': self.id,
            'args': list(self.args),
            'kwargs': dict(self.kwargs),
            'queue': self.queue,
        }
        try:
            text = json.dumps(metadata, separators=(',', ':'), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise DurableError(
                f'Task {self.task!r}: its arguments are not JSON ({exc}); a durable task stores them with its '
                'execution so that a sweep can send it again. Pass JSON values (ids, not objects).'
            ) from exc
        size = len(text.encode())
        if size > METADATA_BYTES:
            raise DurableError(
                f"Task {self.task!r}: its arguments take {size} bytes as JSON, over the 16 KiB an execution's "
                'metadata holds. Pass ids and let the task load the documents.'
            )
        loaded: dict[str, Any] = json.loads(text)
        return loaded

    @classmethod
    def from_metadata(cls, key: str, metadata: object) -> Delivery | None:
        """The delivery an execution recorded, or `None` for metadata no fleet wrote (or of another key)."""
        if not isinstance(metadata, dict):
            return None
        engine, task, task_id = metadata.get('engine'), metadata.get('task'), metadata.get('id')
        args, kwargs, queue = metadata.get('args', []), metadata.get('kwargs', {}), metadata.get('queue')
        if not (isinstance(engine, str) and isinstance(task, str) and isinstance(task_id, (str, int))):
            return None
        if isinstance(task_id, bool) or not isinstance(args, list) or not isinstance(kwargs, dict):
            return None
        if key != execution_key(task, task_id) or not (queue is None or isinstance(queue, str)):
            return None
        return cls(engine, task, task_id, args, kwargs, queue)
