"""Journal backends: one protocol, several stores."""

from ._protocol import ExecutionInfo, Journal, Lease, LeaseRenewal, RunSnapshot
from ._sealing import KEYS_VARIABLE as KEYS_VARIABLE  # for the CLI
from ._sealing import SEALED as SEALED
from ._sealing import Encryption
from ._sealing import Sealer as Sealer
from ._sealing import reseal as reseal
from .disk import DiskJournal
from .memory import MemoryJournal
from .postgres import PostgresJournal

__all__ = (
    'DiskJournal',
    'Encryption',
    'ExecutionInfo',
    'Journal',
    'Lease',
    'LeaseRenewal',
    'MemoryJournal',
    'PostgresJournal',
    'RunSnapshot',
)
