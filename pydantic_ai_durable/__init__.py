"""Crash-safe pydantic-ai agents: journal every step of a run and replay it after a crash.

```python
agent = Agent(model, name='researcher', capabilities=[Durable(journal=DiskJournal('.durable'))])

async with execution('order-42'):
    result = await agent.run('...')
```
"""

from ._capability import Durable
from ._errors import DurableError, ExecutionBusy, JournalError, JournalUnavailable
from ._execution import Execution, ExecutionUsage, execution
from ._journal import Stats
from ._masking import SecretRegistry, register_secret
from .journals import DiskJournal, ExecutionInfo, Journal, MemoryJournal, PostgresJournal

__all__ = (
    'DiskJournal',
    'Durable',
    'DurableError',
    'Execution',
    'ExecutionBusy',
    'ExecutionInfo',
    'ExecutionUsage',
    'Journal',
    'JournalError',
    'JournalUnavailable',
    'MemoryJournal',
    'PostgresJournal',
    'SecretRegistry',
    'Stats',
    'execution',
    'register_secret',
)

__version__ = '0.1.0'
