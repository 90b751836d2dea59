"""The step pipeline: the one sequence every journaled step goes through, whatever its kind.

Claim the next position, replay the recorded result while it still loads, or run the body live and record
what it returned. What differs from one kind of step to another (how its request is fingerprinted, how its
result is encoded and decoded, how its usage is counted) is a `StepKind`'s, and nothing else is: a new kind
of step is a new `StepKind` handed to `run_step`. This is the only module above the journal core that claims
positions and writes steps (`tests/test_layout.py` checks it), so the replay rules (X-1, X-2, DV-1, DV-2) and
the recording rules (W-5, JF-5) are kept once, here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._active_run import ActiveRun
from .._core import Kind, Step
from .._errors import ResultNotJournalable
from .._tracing import replayed, traced
from ._codec import Loaded

__all__ = ('Body', 'Decoder', 'StepKind', 'run_step')

Body = Callable[[], Awaitable[object]]
"""A step's live body as pydantic-ai (or a toolset, or an output function) hands it over."""

Decoder = Callable[[object], object]
"""Loads a recorded payload as pydantic-ai will; raises `TypeError`/`ValueError` when it no longer loads."""


@dataclass
class StepKind:
    """What one kind of step does its own way; `run_step` does the rest. One object stands for one step.

    `run_step` calls, in this order: `fingerprint` (before the claim); on a replay `decode`, then `replayed`;
    live, `going_live`, `live` (the body), `spent`, `finished`, and `ended` however the live step ended.
    Every kind writes `live`; the other defaults do nothing special, so a kind writes only what it does its
    own way. State a kind keeps between its hooks (a live response, a nested usage) lives on the object,
    which serves one step only. The kinds made for every step (model requests, routed tool calls) are built
    with positional arguments: keyword arguments to a class cost about twice the instructions.
    """

    journal_kind: ClassVar[Kind] = 'other'
    """The kind the journal records (P-6); several kinds of step share one (tools and output functions)."""
    masked: ClassVar[bool] = False
    """Whether the recorded payload goes through the run's secret registry first."""
    verified: ClassVar[bool] = False
    """Whether a replay holds only while a fresh run of the body gives what was recorded: `differs`."""

    name: str
    """The step's name (P-3)."""
    replayable: bool
    """`False`: the step takes its position but always runs live."""
    decoder: Decoder | None
    """Loads a recorded payload (pydantic-ai's result codec, or the package's own); `None`: used as it is."""
    hands_on: bool
    """Whether a replay hands pydantic-ai the decoded value as `Loaded`, which its codec passes through."""
    call: str | None = field(default=None, init=False)
    """A tool call's digest of name and arguments, set by `fingerprint`: what argument matching compares."""
    sent: Any = field(default=None, init=False)
    """What the step was asked, recorded with its entry when set by `going_live`."""
    earlier: Callable[[], str | None] | None = field(default=None, init=False)
    """Its fingerprint under an earlier scheme, computed only when the current one misses (FP-16)."""

    def fingerprint(self, active: ActiveRun) -> str | None:
        """The fingerprint the step is claimed with (FP-rules); whatever must precede the claim happens here too.

        It never waits, so parallel calls claim positions in the order they started (P-2); a kind whose
        fingerprint needs to wait (a model request's resolves its model) computes it before it is built.
        """
        return None

    def decode(self, payload: object) -> object:
        """A recorded payload as the caller will use it; `TypeError`/`ValueError` rejects the replay."""
        return self.decoder(payload) if self.decoder is not None else payload

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        """What the caller gets for a replayed step whose payload decoded to `value`; the ledger is credited here.

        Raising is how a recorded control-flow signal reaches the caller: the step's writes still happen.
        """
        return Loaded(value) if self.hands_on else step.payload

    def going_live(self, active: ActiveRun, step: Step) -> Awaitable[None] | None:
        """What must happen before a live body starts (limit checks); a write to await first, if any (U2-1).

        An `async def` is fine where it writes; a kind with nothing to await returns `None`, and no coroutine.
        """
        return None

    def live(self, active: ActiveRun) -> Awaitable[object]:
        """The body to await (an `async def` where the kind does more): it gives the payload to record."""
        raise NotImplementedError

    def spent(self, active: ActiveRun, payload: object) -> dict[str, Any] | None:
        """The run's spend snapshot to store with the entry, after counting what the body spent (U2-1)."""
        return None

    def finished(self, active: ActiveRun, step: Step, payload: object) -> object:
        """What the caller gets for a live step whose payload was recorded (a control-flow signal is raised)."""
        return payload

    def ended(self) -> None:
        """Called once a live step ended, recorded or not: undo what `going_live` set up."""

    def fails_from(self, error: BaseException) -> int | None:
        """Where a recorded outcome `replayed` or `finished` raised counts as a failure for the fence (F-2).

        `None` (the default): a control-flow signal, which says nothing about the run's failure. A model step
        whose recorded outcome is a model error gives a position, so a run that error fails sends it again (A-16).
        """
        return None

    def differs(self, recorded: object, fresh: object) -> str | None:
        """For a `verified` kind: why a fresh result no longer matches the recorded one, or `None`."""
        return None


async def run_step(active: ActiveRun, kind: StepKind) -> object:
    """Claim a step of `active`'s run for `kind`, then replay it, or run its body live and record what it returned.

    A live body runs after the lease check and under `step.executing()`, so agent runs it starts nest under
    it; a body that raises records nothing and leaves a note for the run's failure fence, except
    a result that cannot be journaled, which leaves a fence at its position.
    """
    fingerprint = kind.fingerprint(active)  # first: it sets the call digest
    step = active.run.claim(
        kind.name, kind.journal_kind, fingerprint, replayable=kind.replayable, call=kind.call, earlier=kind.earlier
    )
    if step.replayed:
        if kind.verified:
            return await _replay_verified(active, step, kind)
        try:
            value = kind.decode(step.payload)
        except (TypeError, ValueError):
            step.reject()  # it no longer loads: it runs live instead, and the run diverges here
        else:
            replayed(step)  # its span says so
            try:
                return kind.replayed(active, step, value)
            except Exception as exc:
                _note_outcome(kind, step, exc)
                raise
            finally:
                if step.by_arguments:  # the next attempt replays it by position, a value or a signal alike
                    await step.keep()
    active.refuse_if_cancelling()  # TM-10: an attempt that cancels its execution runs nothing live
    ahead = kind.going_live(active, step)
    if ahead is not None:
        await ahead
    try:
        await step.start()  # stops here if the attempt lost its lease or its journal
        try:
            with step.executing(), traced(step):
                payload = await kind.live(active)
            step.reached('after_body')
        except BaseException as exc:
            step.failed(exc)
            if isinstance(exc, ResultNotJournalable) and exc.step is step:
                await step.run.writes.fence(step, exc)  # it ran: a retry must not repeat it silently
            raise
        await step.record(
            payload, to_record=active.mask if kind.masked else None, spend=kind.spent(active, payload), sent=kind.sent
        )
        step.reached('after_record')
        try:
            return kind.finished(active, step, payload)
        except Exception as exc:
            _note_outcome(kind, step, exc)
            raise
    finally:
        kind.ended()


def _note_outcome(kind: StepKind, step: Step, error: BaseException) -> None:
    """Note a recorded outcome raised as a failure where the kind says it counts as one (`fails_from`)."""
    position = kind.fails_from(error)
    if position is not None:
        step.failed(error, recorded=position)


async def _replay_verified(active: ActiveRun, step: Step, kind: StepKind) -> object:
    """Replay a step only while a fresh run of its body gives what was recorded.

    The body runs as a live one would (after the lease check, under `executing()`), but a replay that holds
    writes nothing. When `differs` gives a reason, the step is rejected with it (so the run diverges and
    every later step runs live) and the fresh result is recorded in place of the old one.
    """
    await step.ensure_attempt()  # a stale attempt runs nothing
    try:
        with step.executing(), traced(step):  # described once the comparison decided replayed or live
            fresh = await kind.live(active)
            reason = kind.differs(step.payload, fresh)
            if reason is not None:
                step.reject(reason)
    except BaseException as exc:
        step.failed(exc)
        raise
    if reason is None:
        return step.payload
    await step.record(fresh)
    return fresh
