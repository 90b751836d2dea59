"""What every layer needs of the process it runs in: who it is, its clock, its background loop, deadlines.

Process identity and lease holders (`_holder`), the one background event loop (`_background`), the
deadline of the journal call being retried (`_deadline`), the retention value (`_retention`) and how a stored
time is shown (`_times`) are used
from the journal backends up to the capability, so they sit below all of them. Nothing here imports
another part of the package.
"""

from ._background import THREAD_NAME, BackgroundLoop, background, call_on
from ._deadline import DEADLINE
from ._holder import (
    boot_id,
    end_holding,
    is_proper,
    is_this_process,
    local_clock,
    new_holder,
    ours_and_ended,
    process_token,
    start_holding,
    token_of,
)
from ._retention import DEFAULT_RETENTION, Retention, retention_seconds
from ._times import beyond_calendar, utc_moment, utc_text

__all__ = (
    'DEADLINE',
    'DEFAULT_RETENTION',
    'THREAD_NAME',
    'BackgroundLoop',
    'Retention',
    'background',
    'beyond_calendar',
    'boot_id',
    'call_on',
    'end_holding',
    'is_proper',
    'is_this_process',
    'local_clock',
    'new_holder',
    'ours_and_ended',
    'process_token',
    'retention_seconds',
    'start_holding',
    'token_of',
    'utc_moment',
    'utc_text',
)
