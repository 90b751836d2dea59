"""Journal backends: one protocol, several stores."""

from ._protocol import ExecutionInfo, Journal, Lease, RunSnapshot
from .disk import DiskJournal
from .memory import MemoryJournal

__all__ = ('DiskJournal', 'ExecutionInfo', 'Journal', 'Lease', 'MemoryJournal', 'RunSnapshot')
