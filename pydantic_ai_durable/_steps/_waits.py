"""The agent graph's waits during a journaled run: one the recorded attempt waited already is not waited again.

pydantic-ai waits in the run itself, between the attempts `RetryOnModelErrors` makes at a failed request and
between polls of a model's server-side job, through the sleep `Agent.using_sleep` installs. A replay raises
the recorded error (A-16) or hands back the recorded poll, so the graph would wait the whole backoff again
before a step that then replays at once. While a run is active, a wait whose next step is recorded (and
would replay) returns at once; every other wait goes to the sleep installed around the run, or
`anyio.sleep` (A-17).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager

import anyio
from pydantic_ai import Agent

from .._active_run import ActiveRun
from .._compat import graph_sleep
from .._core import current_step

__all__ = ('replayed_waits',)


def replayed_waits(active: ActiveRun) -> AbstractContextManager[None]:
    """Install, for the run's block, the agent graph's sleep that skips the waits before a recorded step."""
    outer = graph_sleep()
    return Agent.using_sleep(_sleep(active, outer))


def _sleep(active: ActiveRun, outer: Callable[[float], Awaitable[None]] | None) -> Callable[[float], Awaitable[None]]:
    async def sleep(seconds: float) -> None:
        run = active.run
        # Only the run's own waits: one inside a live step's body of this run (an agent the step runs without
        # a `Durable` of its own) belongs to that body.
        step = current_step()
        if (step is None or step.run is not run) and run.peek(run.next_position) is not None:
            return  # the attempt that recorded the next step waited before it
        if outer is not None:
            await outer(seconds)
        else:
            await anyio.sleep(max(seconds, 0))

    return sleep
