"""The fleet core: what every adapter of durable agents to a job queue shares.

An adapter (`pydantic_ai_durable.celery`, `pydantic_ai_durable.procrastinate`, or one of your own for
Dramatiq, arq or RQ) holds only what is its queue's. Per app it makes one `Fleet` (`fleet_of`) with how
to send a task again from its `Delivery`; it registers each durable task (`Fleet.add`), runs each
delivery in its execution (`Fleet.run`, `Fleet.run_sync`), turns the journal errors those raise into its
queue's retries (`retry_after`), and sweeps in every worker (`SweepThread`, or `sweep_on_this_loop` on a
worker's event loop). `redispatch` sends one execution's task again from what it recorded; importing this
package makes it what `resolve(..., dispatch=True)` sends a decided execution with. A delivery
whose execution ends waiting returns a `Waiting`. docs/fleet.md walks through an adapter.
"""

from .. import set_dispatcher
from ._delivery import Delivery, execution_key
from ._fleet import DurableTask, Fleet, Recover, Send, check_timing, fleet_of, redispatch
from ._retry import Retry, retry_after
from ._sweeping import SweepThread, sweep_on_this_loop
from ._waiting import Waiting

set_dispatcher(redispatch)

__all__ = (
    'Delivery',
    'DurableTask',
    'Fleet',
    'Recover',
    'Retry',
    'Send',
    'SweepThread',
    'Waiting',
    'check_timing',
    'execution_key',
    'fleet_of',
    'redispatch',
    'retry_after',
    'sweep_on_this_loop',
)
