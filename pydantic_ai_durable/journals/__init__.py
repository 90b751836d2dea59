"""Journal backends: one protocol, several stores.

The names in `__all__` are public. The others imported here with `as` are this package's door for the rest
of `pydantic_ai_durable` (the journal core, the CLI, the codec): nothing outside `journals/` imports one of
its private modules.
"""

from ._common import delete_under_lease as delete_under_lease
from ._common import metadata_of as metadata_of
from ._common import state_of as state_of
from ._deferred import DEFERRED as DEFERRED
from ._deferred import CallDecision, DeferredCall
from ._deferred import CallKind as CallKind
from ._deferred import decision_of as decision_of
from ._deferred import deferred_calls as deferred_calls
from ._deferred import deferred_slots as deferred_slots
from ._deferred import pending_of as pending_of
from ._deferred import wait_ref as wait_ref
from ._disk_format import DATABASE as DATABASE  # for the CLI
from ._dsn import mask_dsn as mask_dsn
from ._dsn import scrub as scrub
from ._json import dumps as dumps
from ._json import encodable as encodable
from ._protocol import EXECUTION_STATES as EXECUTION_STATES
from ._protocol import ExecutionInfo, ExecutionPage, Journal, Lease, LeaseRenewal, RunSnapshot
from ._protocol import ExecutionState as ExecutionState
from ._sealing import KEYS_VARIABLE as KEYS_VARIABLE  # for the CLI
from ._sealing import SEALED as SEALED
from ._sealing import Encryption
from ._sealing import Sealer as Sealer
from ._sealing import clear_marker as clear_marker
from ._sealing import plain_values_opened as plain_values_opened
from ._sealing import reseal as reseal
from ._timer_waits import TIMERS as TIMERS
from ._timer_waits import timer_waits as timer_waits
from ._timer_waits import wakes_at as wakes_at
from .disk import DiskJournal
from .disk import default_directory as default_directory
from .memory import MemoryJournal
from .postgres import PostgresJournal

__all__ = (
    'CallDecision',
    'DeferredCall',
    'DiskJournal',
    'Encryption',
    'ExecutionInfo',
    'ExecutionPage',
    'Journal',
    'Lease',
    'LeaseRenewal',
    'MemoryJournal',
    'PostgresJournal',
    'RunSnapshot',
)
