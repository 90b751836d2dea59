"""Crash-safe pydantic-ai agents: journal every step of a run and replay it after a crash.

```python
agent = Agent(model, name='researcher', capabilities=[Durable(journal=DiskJournal('.durable'))])

async with execution('order-42'):
    result = await agent.run('...')
```
"""

from typing import TYPE_CHECKING, Any

from ._core import (
    ImportReport,
    Limits,
    Resolution,
    Stats,
    cancel_execution,
    copy_execution,
    deny_overdue,
    export_execution,
    fork_execution,
    import_execution,
    pending_calls,
    retry_delay,
    set_dispatcher,
    sweep_interrupted,
)
from ._errors import (
    DispatchFailed,
    DurableError,
    EncryptionMismatch,
    ExecutionBusy,
    ExecutionCancelled,
    ExecutionWaiting,
    ExportInvalid,
    ImportRefused,
    JournalCorrupt,
    JournalError,
    JournalUnavailable,
    LeaseLost,
    MetadataMismatch,
    ReplayDiverged,
    ResolutionRefused,
    ResultNotJournalable,
)
from .journals import (
    CallDecision,
    DeferredCall,
    DiskJournal,
    Encryption,
    ExecutionInfo,
    Journal,
    MemoryJournal,
    PostgresJournal,
)

if TYPE_CHECKING:
    from ._capability import Durable
    from ._decisions import ask_user_request, fail_external_event, resolve, resolve_external_event
    from ._execution import Execution, ExecutionUsage, execution
    from ._masking import SecretRegistry, register_secret
    from ._messages import recorded_messages

# The names below import pydantic-ai, which takes seconds; the journal and the CLI do not need it,
# so they are loaded on first use.
_LAZY = {
    'Durable': '._capability',
    'ask_user_request': '._decisions',
    'resolve': '._decisions',
    'resolve_external_event': '._decisions',
    'fail_external_event': '._decisions',
    'Execution': '._execution',
    'ExecutionUsage': '._execution',
    'execution': '._execution',
    'SecretRegistry': '._masking',
    'recorded_messages': '._messages',
    'register_secret': '._masking',
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = (
    'CallDecision',
    'DeferredCall',
    'DiskJournal',
    'DispatchFailed',
    'Durable',
    'DurableError',
    'Encryption',
    'EncryptionMismatch',
    'Execution',
    'ExecutionBusy',
    'ExecutionCancelled',
    'ExecutionInfo',
    'ExecutionUsage',
    'ExecutionWaiting',
    'ExportInvalid',
    'ImportRefused',
    'ImportReport',
    'Journal',
    'JournalCorrupt',
    'JournalError',
    'JournalUnavailable',
    'LeaseLost',
    'Limits',
    'MemoryJournal',
    'MetadataMismatch',
    'PostgresJournal',
    'ReplayDiverged',
    'Resolution',
    'ResolutionRefused',
    'ResultNotJournalable',
    'SecretRegistry',
    'Stats',
    'ask_user_request',
    'cancel_execution',
    'copy_execution',
    'deny_overdue',
    'execution',
    'export_execution',
    'fail_external_event',
    'fork_execution',
    'import_execution',
    'pending_calls',
    'recorded_messages',
    'register_secret',
    'resolve',
    'resolve_external_event',
    'retry_delay',
    'set_dispatcher',
    'sweep_interrupted',
)

__version__ = '0.1.0'
