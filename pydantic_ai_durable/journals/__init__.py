"""Journal backends: one protocol, several stores."""

from ._protocol import ExecutionInfo, Journal, Lease, LeaseRenewal, RunSnapshot
from .disk import DiskJournal
from .memory import MemoryJournal
from .postgres import PostgresJournal

__all__ = (
    'DiskJournal',
    'ExecutionInfo',
    'Journal',
    'Lease',
    'LeaseRenewal',
    'MemoryJournal',
    'PostgresJournal',
    'RunSnapshot',
)
