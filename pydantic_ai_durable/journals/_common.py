"""Small pieces every backend shares: key hashing, lease rules and status of a listed execution."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from ._protocol import ExecutionStatus, Lease

__all__ = ('execution_id', 'lease_available', 'status_of')


def execution_id(key: str) -> str:
    """A fixed-length identity for an execution key.

    Hashing the whole key means no separator inside a key can make two executions share storage
    (J-6, B-4): `etl`+`load_data` and `etl_load`+`data` are different strings, so different digests.
    """
    return hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()


def lease_available(current: Lease | None, holder: str, take_over: str | None, now: float) -> bool:
    """Whether `holder` may take the lease now: free, expired, its own, or a holder proved dead."""
    return (
        current is None
        or current.expires_at <= now
        or current.holder == holder
        or (take_over is not None and current.holder == take_over)
    )


def status_of(record: dict[str, Any] | None, lease: Lease | None, now: float | None = None) -> ExecutionStatus:
    """Running while a live lease exists; otherwise what the last attempt said, `failed` if it died silently."""
    now = time.time() if now is None else now
    if lease is not None and lease.expires_at > now:
        return 'running'
    status = (record or {}).get('status')
    return 'finished' if status == 'finished' else 'failed'
