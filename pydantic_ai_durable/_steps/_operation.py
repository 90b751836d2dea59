"""Durable operations other than model requests and tool calls: steps of kind `other`.

pydantic-ai routes events of the run's event handler, capability `@durable_operation`s, tool discovery
and, in later releases, operations this package does not know yet. None of them is fingerprinted but an
event, which replays at its position whatever ran before it; a capability operation reports its own usage.
Tool discovery is verified by listing again (`_discovery`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from .._active_run import ActiveRun
from .._core import Step
from .._fingerprint import fingerprint_event
from .._usage import without_operation_usage
from ._pipeline import Body, StepKind

__all__ = ('CapabilityOperation', 'EventCall', 'Operation')


@dataclass
class Operation(StepKind):
    """An operation journaled as it is: no fingerprint, its payload encoded by pydantic-ai's codec."""

    body: Body

    def live(self, active: ActiveRun) -> Awaitable[object]:
        return self.body()


@dataclass
class EventCall(Operation):
    """A call of the run's event stream handler, fingerprinted by its event."""

    event: object

    def fingerprint(self, active: ActiveRun) -> str | None:
        return fingerprint_event(self.event)


@dataclass
class CapabilityOperation(Operation):
    """A capability's `@durable_operation`, whose result carries the usage it spent."""

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        return without_operation_usage(step.payload)  # the live attempt counted it already

    def spent(self, active: ActiveRun, payload: object) -> dict[str, Any] | None:
        return active.spend.operation_finished(payload)
