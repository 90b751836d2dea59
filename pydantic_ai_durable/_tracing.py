"""OpenTelemetry attributes that tell a replayed step from a live one.

pydantic-ai's instrumentation runs again when a resumed run replays, so without this every replayed step
looks live in a trace, and its `chat` span reports the recorded tokens as if they were spent twice. Each
journaled step's span says whether it replayed, where it is in which execution, and why it ran live after
a mismatch; each run's span names its execution and attempt, so the traces of one execution can be joined.
Where pydantic-ai can keep replayed work out of traces and metrics (`replay_scope`, 2.68 and later), it
does, and the replayed step is shown by a span of ours that reports no usage. Only OpenTelemetry's API is
used: spans go wherever the agent's instrumentation sends them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType

import pydantic_ai.durable_exec as _durable_exec
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer
from opentelemetry.util.types import AttributeValue
from pydantic_ai.usage import RunUsage

from ._core import Run, Step

__all__ = (
    'ATTEMPT',
    'BY_ARGUMENTS',
    'DIVERGENCE',
    'EXECUTION_KEY',
    'KIND',
    'POSITION',
    'REPLAYED',
    'RUN',
    'SPENT',
    'STEP',
    'STEP_SPAN',
    'replayed',
    'traced',
    'traced_run',
)

REPLAYED = 'pydantic_ai_durable.replayed'
BY_ARGUMENTS = 'pydantic_ai_durable.replayed_by_arguments'
EXECUTION_KEY = 'pydantic_ai_durable.execution_key'
ATTEMPT = 'pydantic_ai_durable.attempt'
RUN = 'pydantic_ai_durable.run'
POSITION = 'pydantic_ai_durable.position'
STEP = 'pydantic_ai_durable.step'
KIND = 'pydantic_ai_durable.kind'
DIVERGENCE = 'pydantic_ai_durable.divergence'
SPENT = 'pydantic_ai_durable.spent.'
"""Prefix of the run span's attributes for what this attempt spent live: requests, input/output tokens, cost."""

STEP_SPAN = 'durable step {name}'
"""The name of the span of ours a step gets when pydantic-ai exports none for it."""

_OPERATION = 'gen_ai.operation.name'
_OWN_SPAN = {'model': 'chat', 'tool': 'execute_tool'}
"""The `gen_ai.operation.name` of the span pydantic-ai opens around each kind of step (none for the others)."""

# pydantic-ai 2.68 and later: the public way to keep replayed work out of traces and metrics; read by name,
# so one source type-checks and runs against releases with and without it.
_replay_scope: Callable[[], AbstractContextManager[None]] | None = getattr(_durable_exec, 'replay_scope', None)
_record_unit: Callable[..., None] | None = getattr(_durable_exec, 'record_durable_unit', None)

DROPS_REPLAYED_SPANS = _replay_scope is not None
"""Whether pydantic-ai leaves the spans of replayed steps unexported (and their usage out of its metrics)."""


@dataclass(frozen=True)
class _RunTrace:
    root: Span
    """The agent run's span, parent of the spans of ours that stand for replayed steps."""
    tracer: Tracer


_RUN_TRACE: ContextVar[_RunTrace | None] = ContextVar('pydantic_ai_durable.run_trace', default=None)


def _operation(span: Span) -> object:
    attributes = getattr(span, 'attributes', None)  # the SDK's spans have them; the API promises none
    return attributes.get(_OPERATION) if attributes else None


def _tracer(capabilities: object) -> Tracer:
    """The tracer of the agent's `Instrumentation`, so our spans go where its spans go; else the global one."""
    from pydantic_ai.capabilities import Instrumentation

    for capability in capabilities.values() if isinstance(capabilities, dict) else ():
        if isinstance(capability, Instrumentation):
            return capability.settings.tracer
    return trace.get_tracer('pydantic_ai_durable')


@contextmanager
def traced_run(run: Run, capabilities: object, spent: Callable[[], RunUsage]) -> Iterator[None]:
    """Around one agent run: name the execution and attempt on its span, and keep replays out of metrics (TR-3).

    At the end the run's span also gets what this attempt really spent (`spent`): pydantic-ai's
    `gen_ai.aggregated_usage.*` on it adds up the responses the run saw, replayed ones included.
    """
    span = trace.get_current_span()
    root = span.is_recording() and _operation(span) == 'invoke_agent'
    if root:
        span.set_attributes({EXECUTION_KEY: run.attempt.key, ATTEMPT: run.attempt.number, RUN: run.key})
    token = _RUN_TRACE.set(_RunTrace(span, _tracer(capabilities)) if root else None)  # untraced: emit nothing
    try:
        with _replay_scope() if _replay_scope is not None else nullcontext():
            yield
    finally:
        _RUN_TRACE.reset(token)
        if root:
            span.set_attributes(_spent_attributes(spent()))


def _spent_attributes(usage: RunUsage) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        SPENT + 'requests': usage.requests,
        SPENT + 'input_tokens': usage.input_tokens,
        SPENT + 'output_tokens': usage.output_tokens,
    }
    if usage.cost is not None:
        attributes[SPENT + 'cost'] = float(usage.cost)
    return attributes


def _attributes(step: Step) -> dict[str, AttributeValue]:
    run = step.run
    attributes: dict[str, AttributeValue] = {
        REPLAYED: step.replayed,
        EXECUTION_KEY: run.attempt.key,
        ATTEMPT: run.attempt.number,
        RUN: run.key,
        POSITION: step.position,
        STEP: step.name,
        KIND: step.kind,
    }
    if step.by_arguments:
        attributes[BY_ARGUMENTS] = True  # the recorded result of the same call, made at another position
    for divergence in reversed(run.stats.divergences):
        if divergence.run == run.key and divergence.position == step.position:
            attributes[DIVERGENCE] = divergence.reason
            break
    return attributes


def _own_span(step: Step) -> Span | None:
    """The span pydantic-ai opened around this step, if it opened one and it records."""
    span = trace.get_current_span()
    if span.is_recording() and _operation(span) == _OWN_SPAN.get(step.kind):
        return span
    return None


def traced(step: Step) -> AbstractContextManager[None]:
    """Around a step's live body: its span says it ran live, and why, after a mismatch (TR-2).

    A model or tool step has a span of pydantic-ai's; the other kinds get one of ours around the body,
    described when the body is done, since a discovery step may turn live only then.
    """
    return _Traced(step)


class _Traced:
    """`traced`'s block; a class, not a generator, since every live step enters one."""

    __slots__ = ('_ours', '_span', '_step')

    def __init__(self, step: Step) -> None:
        self._step = step
        self._ours: AbstractContextManager[Span] | None = None

    def __enter__(self) -> None:
        step = self._step
        own = _own_span(step)
        if own is not None:
            own.set_attributes(_attributes(step))
            return
        run_trace = _RUN_TRACE.get()
        if run_trace is not None:
            self._ours = run_trace.tracer.start_as_current_span(STEP_SPAN.format(name=step.name))
            self._span = self._ours.__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        ours = self._ours
        if ours is not None:
            try:
                self._span.set_attributes(_attributes(self._step))
            finally:
                ours.__exit__(kind, error, tb)
        if kind is None and _record_unit is not None:
            _record_unit(executed=True)


def replayed(step: Step) -> None:
    """Mark a step that replayed (TR-1), so no span reports its recorded usage as spent (TR-4).

    Where pydantic-ai drops the spans of replayed work, a span of ours, under the run's, stands for the
    step and reports no usage; otherwise pydantic-ai's own span of the step is marked.
    """
    if _record_unit is not None:
        _record_unit(executed=False)
    own = None if DROPS_REPLAYED_SPANS else _own_span(step)
    if own is not None:
        own.set_attributes(_attributes(step))
        return
    run_trace = _RUN_TRACE.get()
    if run_trace is None:
        return
    context = trace.set_span_in_context(run_trace.root)
    run_trace.tracer.start_span(STEP_SPAN.format(name=step.name), context=context, attributes=_attributes(step)).end()
