"""The active run: what one agent run holds while it runs inside an execution, and which run is whose.

The operation backend, leaf toolsets and output functions turn pydantic-ai's calls into journal steps.
For that they need the run's journal `Run`, its usage ledger, spend, fingerprinter and secrets, and no
more of the `Durable` capability that opened the run: this module is what they depend on, so the
capability stays the only module that knows all the others. `Durable.wrap_run` builds an `ActiveRun`
and activates it under its own identity; the executors look it up by the identity they were given.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from ._core import Run
from ._errors import ExecutionCancelled
from ._fingerprint import ModelFingerprinter, RequestPreparer, earlier_scheme_digest
from ._masking import SecretRegistry
from ._usage import NestedUsage, ReplayUsageLedger, RunSpend, is_successful_tool_payload

__all__ = ('ActiveRun', 'ModelResolver', 'activated', 'active_run')

log = logging.getLogger('pydantic_ai_durable')

ModelResolver = Callable[[str | None, RunContext[Any]], Awaitable[Model]]
"""The model a request with this model id goes to (the capability's resolver)."""


@dataclass
class ActiveRun:
    """Everything one agent run needs while it runs inside an execution."""

    run: Run
    ledger: ReplayUsageLedger
    fingerprinter: ModelFingerprinter
    spend: RunSpend
    secrets: SecretRegistry
    resolve_model: ModelResolver
    preparer: RequestPreparer = field(default_factory=RequestPreparer)
    sent_upto: int = 0
    """How many messages of the history the run's model requests have recorded so far, with their
    responses: the next request records only what follows."""
    failed_streak: tuple[int, int] | None = None
    """The first and last positions of the latest model steps whose recorded outcome is an error, one after
    another (A-16): a run the last one fails is fenced at the first."""
    deferred_tools: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """The tool metadata of each call the run was asked to decide, by call id: its record lists it."""
    deferred_at: dict[str, int] = field(default_factory=dict)
    """The position of the wait where the run was last asked to decide each call, by call id (WT-7)."""
    keeps_job: bool = False
    """Set once the attempt's cancellation reached a wait or a poll (TM-6), or the attempt ended at a long wait
    (TM-4): pydantic-ai's cancellation of the provider's job is then not sent, and the next attempt checks it."""
    suspend_waits_over: float | None = None
    """`Durable(suspend_waits_over=...)`: a wait longer than this ends the attempt, with the execution `waiting`
    until the wait's wake-up time (TM-4); `None`: every wait holds the attempt's process."""
    cancelling: tuple[str, float] | None = None
    """The reason and time of the cancellation this attempt carries out (`cancel_execution`, TM-10): no step runs
    live, and the provider's job the run waits on is cancelled."""
    outer_sleep: Callable[[float], Awaitable[None]] | None = None
    """The sleep the app installed for the agent graph's waits (`Agent.using_sleep`), which a timer's live wait
    and a recovered wait go to; `None`: `anyio.sleep` (TM-1)."""

    @property
    def top_level(self) -> bool:
        """Whether the app started this run itself: only such a run leaves its execution waiting (a deferral, a
        pending response, a long wait); a nested run's is its caller's result, inside its caller's step."""
        return '.' not in self.run.key

    def refuse_if_cancelling(self) -> None:
        """Raise `ExecutionCancelled` where this attempt carries out a cancellation (TM-10)."""
        if self.cancelling is not None:
            raise ExecutionCancelled(self.run.attempt.key, reason=self.cancelling[0], at=self.cancelling[1])

    def mask(self, payload: Any) -> Any:
        return self.secrets.mask(payload)

    def tool_spend(self, payload: object, nested: NestedUsage | None = None) -> dict[str, Any] | None:
        """Count a finished live tool call (pydantic-ai counts only successful ones) and its nested usage."""
        return self.spend.tool_call_finished(is_successful_tool_payload(payload), nested)

    async def fingerprint_model_request(
        self,
        model_id: str | None,
        messages: Sequence[ModelMessage],
        settings: ModelSettings | None,
        params: ModelRequestParameters,
        ctx: RunContext[Any],
    ) -> tuple[str | None, Callable[[], str | None] | None]:
        """Fingerprint a request as the model it goes to will see it (A-7), with its first-scheme digest (FP-16)."""
        step = self.run.next_position
        try:
            model = await self.resolve_model(model_id, ctx)
            prepared_settings, prepared_params = self.preparer.prepare(model, settings, params)
            identity = f'{model.system}:{model.model_name}'
        except Exception as exc:
            log.warning(
                'Model step %d could not be fingerprinted (%s: %s); it replays only right after a replayed step, '
                'and later model steps are usually affected too.',
                step,
                type(exc).__name__,
                exc,
            )
            return None, None
        settings_dict = dict(prepared_settings) if prepared_settings else None
        fingerprint = self.fingerprinter.fingerprint(identity, messages, settings_dict, prepared_params, step=step)
        if fingerprint is None:
            return None, None
        return fingerprint, earlier_scheme_digest(identity, messages, settings_dict, prepared_params, self.secrets)


_ACTIVE_RUNS: ContextVar[Mapping[int, ActiveRun] | None] = ContextVar('pydantic_ai_durable.active_runs', default=None)
"""The run each `Durable` (by identity) is executing in this task; nested runs add their own entry."""


def active_run(owner: object) -> ActiveRun | None:
    """The run `owner` (a `Durable` capability) is executing in this task, if any."""
    return (_ACTIVE_RUNS.get() or {}).get(id(owner))


@contextmanager
def activated(owner: object, active: ActiveRun) -> Iterator[None]:
    """Make `active` the run of `owner` in this task (and the tasks it starts) until the block ends."""
    token = _ACTIVE_RUNS.set({**(_ACTIVE_RUNS.get() or {}), id(owner): active})
    try:
        yield
    finally:
        _ACTIVE_RUNS.reset(token)
