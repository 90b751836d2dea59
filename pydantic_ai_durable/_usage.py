"""Live usage across attempts (SPEC U2): what each run really spent, persisted as it is spent.

pydantic-ai counts usage per run object and knows nothing of earlier attempts. The journal keeps,
per run, the live spend of every attempt so a resumed run starts from it and `UsageLimits` cap
the total; a model request is counted before it is sent, because a process killed inside it has
already paid.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import RunUsage

from ._journal import Run
from ._ledger import fill_replayed_cost

__all__ = ('RunSpend', 'load_usage')

_USAGE = TypeAdapter(RunUsage)
_RECORD = 'usage'


def load_usage(value: Any) -> RunUsage:
    """The usage stored in a run record; an unreadable record counts as nothing spent."""
    if not isinstance(value, dict):
        return RunUsage()
    try:
        return _USAGE.validate_python(value.get('usage', {}))
    except ValidationError:
        return RunUsage()


class RunSpend:
    """The live usage of one run: what earlier attempts spent, plus what this attempt spends."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self.earlier = load_usage(run.records.get(_RECORD))
        self.attempt = RunUsage()

    @property
    def total(self) -> RunUsage:
        return self.earlier + self.attempt

    async def _save(self) -> None:
        await self._run.write_record(_RECORD, {'usage': _USAGE.dump_python(self.total, mode='json')})

    async def request_sent(self) -> None:
        """Count a live request before it goes out (write-ahead)."""
        self.attempt.requests += 1
        await self._save()

    async def response_received(self, response: ModelResponse) -> None:
        """Add a live response's tokens and price once it is recorded."""
        priced = copy.copy(response)
        priced.usage = copy.copy(response.usage)
        fill_replayed_cost(priced)  # priced the way the graph prices it
        self.attempt.incr(priced.usage)
        await self._save()

    async def tool_call_succeeded(self) -> None:
        self.attempt.tool_calls += 1
        await self._save()
