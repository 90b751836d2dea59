"""Runs that end waiting on the provider: noted in the execution record so the attempt ends `waiting` (TM-7).

A run whose output is pydantic-ai's `PendingModelResponse` left its request with the provider (a batch, a
background response). The attempt's copy of the record lists it under `PROVIDER_WAITS`, by run key, with the
provider's id of the job and since when; the attempt then ends `waiting`, and a later run of the same key
that ends otherwise takes it out. Nothing here writes to a journal: the attempt writes the record.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ('PROVIDER_WAITS', 'note_provider_wait', 'provider_job', 'provider_jobs', 'waits_on_provider')

PROVIDER_WAITS = 'provider_waits'
"""The record field listing the runs that ended waiting on the provider; part of the record format."""


def _waits(record: dict[str, Any]) -> dict[str, Any]:
    stored = record.get(PROVIDER_WAITS)
    return stored if isinstance(stored, dict) else {}


def note_provider_wait(record: dict[str, Any], run: str, job: str | None, model: str | None) -> None:
    """Note that run `run` ended waiting on the provider's job `job` (`None`: it no longer waits)."""
    waits = dict(_waits(record))
    if job is None:
        if run not in waits:
            return
        del waits[run]
    else:
        since = waits.get(run, {}).get('since') if isinstance(waits.get(run), dict) else None
        waits[run] = {'job': job, 'model': model, 'since': since if since is not None else time.time()}
    if waits:
        record[PROVIDER_WAITS] = waits
    else:
        record.pop(PROVIDER_WAITS, None)


def provider_jobs(record: dict[str, Any] | None) -> tuple[str, ...]:
    """The provider's ids of every job a run of the execution ended waiting on (TM-7), for what shows it."""
    jobs = (wait.get('job') for wait in _waits(record or {}).values() if isinstance(wait, dict))
    return tuple(job for job in jobs if isinstance(job, str))


def provider_job(record: dict[str, Any], run: str) -> str | None:
    """The provider's id of the job run `run` ended waiting on, if it did."""
    wait = _waits(record).get(run)
    job = wait.get('job') if isinstance(wait, dict) else None
    return job if isinstance(job, str) else None


def waits_on_provider(record: dict[str, Any]) -> bool:
    """Whether some run of the execution ended waiting on the provider: the attempt then ends `waiting`."""
    return bool(_waits(record))
