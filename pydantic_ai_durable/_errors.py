"""The package's exceptions.

Every message says what happened and what the user can do about it; the classes exist so callers
can tell a journal problem (retrying will not help) from an ordinary failure of their agent.
"""

from __future__ import annotations

from ._runtime import utc_text

__all__ = (
    'ConsoleRefused',
    'DispatchFailed',
    'DurableError',
    'EncryptionMismatch',
    'ExecutionBusy',
    'ExecutionCancelled',
    'ExecutionWaiting',
    'ExportInvalid',
    'ImportRefused',
    'JournalCorrupt',
    'JournalError',
    'JournalUnavailable',
    'LeaseLost',
    'MetadataMismatch',
    'ReplayDiverged',
    'ResolutionRefused',
    'ResultNotJournalable',
)


class DurableError(Exception):
    """Base class of every error raised by `pydantic_ai_durable`."""

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled whole, attributes included (a Celery pool process hands its task's error to the worker so),
        # although most subclasses take keyword-only arguments that unpickling could not pass again.
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[DurableError], args: tuple[object, ...], state: dict[str, object]) -> DurableError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class JournalError(DurableError):
    """A fault of the journal: catching it catches every one.

    A value that cannot be journaled or replayed (this class itself, `ResultNotJournalable`) and a stored
    value that fails its check (`JournalCorrupt`, `EncryptionMismatch`) fail the same way on every attempt,
    so they are not retryable: fix the tool or the keys instead. `JournalUnavailable`, a journal that
    cannot be reached, is the one a retry later may get past (`retry_delay` says when).
    """


class ResultNotJournalable(JournalError):
    """The result of a step that already ran cannot be journaled (not JSON, nested too deeply, ...).

    Its side effect happened, so the journal keeps a fence at that step's position: a retry stops
    there instead of silently running it again. `step` is the journal step whose body produced
    the result, so an outer step whose body merely saw the error pass by is not fenced as well.
    """

    def __init__(self, message: str, *, step: object = None) -> None:
        super().__init__(message)
        self.step = step


class JournalCorrupt(JournalError):
    """A stored value failed its authentication: altered, copied from another place, or sealed with another key.

    It is never replayed and never taken for a missing step, since either could repeat a side effect or
    hide a tampering. `key` is the execution, `where` the value (`"run 0, step 3"`). Also raised, with
    `where="the import"`, for what an import left when it was killed part way.
    """

    def __init__(self, message: str, *, key: str, where: str) -> None:
        super().__init__(message)
        self.key = key
        self.where = where


class EncryptionMismatch(JournalError):
    """The keys given do not fit what is stored: a key id with no key, sealed values without keys, or plain ones with.

    `key_id` names the missing key, if that is the problem (EN-4).
    """

    def __init__(self, message: str, *, key: str, where: str, key_id: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.where = where
        self.key_id = key_id


class ExportInvalid(DurableError, ValueError):
    """An export document that cannot be imported: not JSON, another version, a wrong field, over a limit.

    The whole document is checked before anything is written, so this error means the journal is unchanged.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f'Not imported: {message}. Nothing was written.')


class ImportRefused(DurableError):
    """An import or fork the target journal cannot take: the key exists (without `force`) or is running."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class JournalUnavailable(JournalError):
    """The journal backend cannot be opened, read or written; retrying later may succeed.

    Raised when an execution starts, before any model is called, and in the middle of a run when a
    read or write still fails after retrying: the attempt then stops before the next step's body, so
    no side effect ever follows a step whose record was not acknowledged.
    """


class ExecutionBusy(DurableError):
    """Another live attempt holds the execution's lease.

    Two attempts on one execution would interleave positions and replay each other's answers, so
    the second one is refused before any step runs.
    """

    def __init__(self, key: str, *, holder: str, expires_at: float) -> None:
        self.key = key
        self.holder = holder
        self.expires_at = expires_at
        when = utc_text(expires_at, 'seconds')  # a lease's expiry is a stored time: shown whatever its value
        super().__init__(
            f'Execution {key!r} is held by another live attempt ({holder}) until {when}. '
            'Wait for it to finish, or stop it; a holder that died is taken over automatically.'
        )


class LeaseLost(DurableError):
    """This attempt no longer holds its execution: another attempt took it over, or it was deleted.

    Raised instead of writing (a stale attempt's write is refused by the store) and before the next
    step's body, so an attempt that lost its lease never runs a model request or a tool again and
    never overwrites what the new holder records.
    """

    def __init__(self, key: str, *, holder: str | None, reason: str | None = None) -> None:
        self.key = key
        self.holder = holder
        """The attempt that holds the execution now, or `None` when nobody does (deleted, pruned)."""
        self.reason = reason
        if reason is None:
            reason = f'another attempt ({holder}) took it over' if holder else 'its lease is gone (deleted or pruned)'
        super().__init__(
            f'Execution {key!r} lost its lease: {reason}. This attempt stopped before its next step and wrote '
            'nothing more; the holder of the lease goes on with the execution. Do not retry this attempt while '
            'that one runs; if the other attempt died, retrying resumes from what was recorded.'
        )


class MetadataMismatch(DurableError):
    """An attempt brought other work than its execution recorded: a field of `fixed_metadata` differs.

    A job queue's task id names one piece of work; a second delivery of the id with another task or other
    arguments (a producer's bug, or an id reused on purpose) would run its own steps live under the first
    one's execution. It is refused before anything runs. `recorded` and `given` hold the differing fields.
    """

    def __init__(self, key: str, *, recorded: dict[str, object], given: dict[str, object]) -> None:
        self.key = key
        self.recorded = recorded
        self.given = given

        def said(fields: dict[str, object]) -> str:
            return ', '.join(f'{name} {value!r}' for name, value in fields.items())

        super().__init__(
            f'Execution {key!r} was started for other work: it recorded {said(recorded)}, and this attempt '
            f'brings {said(given)}. Nothing ran. An execution key (a task id) names one piece of work: send '
            f'new work under a new id, or delete the execution (pydantic-ai-durable delete {key}) to reuse the id.'
        )


class ReplayDiverged(DurableError):
    """A run no longer matches its journal, and the execution asked to stop there (`on_divergence="raise"`).

    Raised at the first step that differs from the recorded one, before that step or any later one runs
    live: no model request is sent and no tool runs. The attributes say where (`run`, `position`, `name`),
    why (`reason`), and how much recorded work lies after it (`recorded_after`).
    """

    def __init__(self, key: str, *, run: str, position: int, name: str, reason: str, recorded_after: int) -> None:
        self.key = key
        self.run = run
        self.position = position
        self.name = name
        self.reason = reason
        self.recorded_after = recorded_after
        steps = f'{recorded_after} recorded step{"s" if recorded_after != 1 else ""}'
        verb = 'lie' if recorded_after != 1 else 'lies'
        super().__init__(
            f'Execution {key!r} run {run} diverged at step {position} ({name}): {reason}. {steps} of this run '
            f"{verb} after it. on_divergence='raise' stopped the run here, before this step or any later one ran "
            'live. To go on: restore the agent (instructions, tools, model, settings, MCP servers) as it was when '
            f'the steps were recorded, and every recorded step replays; or delete the execution '
            f"(pydantic-ai-durable delete {key}) to start over; or run it with on_divergence='run_live' (the "
            'default): the changed steps run live, and a tool call whose name and arguments equal a recorded one '
            'gets the recorded result instead of running again.'
        )


class ConsoleRefused(DurableError, ValueError):
    """The console will not start as asked: it would serve the journal to others without a token."""


class ResolutionRefused(DurableError, ValueError):
    """A decision `resolve` cannot record: the execution is not waiting, the call is unknown, decided otherwise
    already, or the decision does not fit the call. Nothing was written.

    `call_id` names the call at fault, or is `None` when the execution itself is the reason.
    """

    def __init__(self, key: str, call_id: str | None, reason: str) -> None:
        self.key = key
        self.call_id = call_id
        self.reason = reason
        super().__init__(f'Execution {key!r} cannot be resolved: {reason}. Nothing was recorded.')


class DispatchFailed(DurableError):
    """`resolve(..., dispatch=True)` recorded the decisions, but sending the execution on to a worker failed.

    The decisions stand, unlike every refusal of `resolve`: a retry of the same decision is accepted and sends
    nothing, and the workers' sweep sends the execution once its `resume_after` has passed (WT-4). `reason`
    says what the send raised.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(
            f'Execution {key!r}: the decisions are recorded, but sending it on to a worker failed ({reason}). '
            "They stand: the workers' sweep sends it once resume_after has passed."
        )


class ExecutionWaiting(DurableError):
    """The run ended its attempt to wait without holding a process: the execution is now `waiting` (EV-2, TM-4).

    Raised out of `agent.run()` inside `execution(key)` when a wait on an external event (`HandleDeferredToolCalls`
    with a handler that takes a token, `wait_for_external_event`) was not answered by its `ask`, or when a wait
    between polls of a batch or a background response is longer than `Durable(suspend_waits_over=...)`. Nothing
    failed and nothing is held: the attempt ends `waiting`, and the same code run again goes on, once the token is
    resolved (`resolve_external_event`, `fail_external_event`, the CLI's `resolve-event`) with its payload, or once
    `wakes_at` has passed. `wait` is the wait's ref (`NAME@RUN:POSITION`); `deadline` and `wakes_at` are epoch
    seconds or `None`.
    """

    def __init__(
        self, key: str, *, name: str, wait: str, deadline: float | None, wakes_at: float | None = None
    ) -> None:
        self.key = key
        self.name = name
        self.wait = wait
        self.deadline = deadline
        self.wakes_at = wakes_at
        if wakes_at is not None:
            message = (
                f'Execution {key!r} waits until {utc_text(wakes_at, "seconds")} ({wait}): the wait is longer than the '
                'process may be held for (Durable(suspend_waits_over=...)), so the attempt ended there. Run the same '
                "code again once that time has passed (the fleet's sweep does); it sleeps only what is left, then goes "
                'on.'
            )
        else:
            message = (
                f'Execution {key!r} waits on the external event {name!r} ({wait}): its ask handed the resume token '
                'on. Run the same code again once the token is resolved; it goes on with the payload.'
            )
        super().__init__(message)


class ExecutionCancelled(DurableError):
    """The execution was cancelled with `cancel_execution`: nothing more of it runs (TM-10).

    Raised out of `agent.run()` by the attempt that carries a cancellation out (it cancels the provider's job the
    run waited on, and runs no step live), and on entering `execution(key)` of a cancelled execution afterwards.
    `reason` is what the canceller gave, `at` epoch seconds of the cancellation.
    """

    def __init__(self, key: str, *, reason: str, at: float) -> None:
        self.key = key
        self.reason = reason
        self.at = at
        super().__init__(
            f'Execution {key!r} was cancelled at {utc_text(at, "seconds")} ({reason}): nothing more of it runs, and '
            "the provider's job it waited on is cancelled. Its journal is kept: delete it, or fork it to run the "
            'same work again under another key.'
        )
