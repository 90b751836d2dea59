"""`Durable`: the pydantic-ai capability that journals an agent's steps inside an `execution()`."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import anyio
from pydantic_ai import Agent
from pydantic_ai.agent import AbstractAgent, EventStreamHandler
from pydantic_ai.capabilities import AbstractCapability, WrapOutputProcessHandler, WrapRunHandler
from pydantic_ai.durable_exec import BaseDurabilityCapability, DurabilityEngineSpec, conversation_id_from_run_id
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.models import Model
from pydantic_ai.output import OutputContext
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset, FunctionToolset

from ._active_run import ActiveRun, activated, active_run
from ._compat import (
    CANCELLATION_TOKENS_ACCEPTED,
    SUSPENDING_ERRORS,
    check_private_hooks,
    graph_sleep,
    in_pydantic_ai_unit,
    name_capability_toolsets,
    resolve_request_model,
)
from ._core import DivergenceMode, SimulatedCrash, cancel_request, check_divergence_mode, current_step
from ._errors import DurableError, ExecutionWaiting
from ._execution import current_attempt, track_spend
from ._fingerprint import ModelFingerprinter, fingerprint_run_start
from ._masking import SECRETS, SecretRegistry
from ._steps import (
    PAYLOAD_CODEC,
    DurableBackend,
    DurableLeafToolset,
    check_wait_timeout,
    durable_wait,
    journal_output_process,
    not_journalable,
    note_run_end,
    opted_out_toolsets,
    recorded_decisions,
    refuse_other_start,
    waits_on_events,
)
from ._tracing import traced_run
from ._usage import ReplayUsageLedger, RunSpend
from .journals import Journal

__all__ = ('Durable',)

log = logging.getLogger('pydantic_ai_durable')

_RESTARTED = (
    'Execution {key!r}: this agent run was started with the messages of the recorded run it stands for as its '
    'history (for example `RunCancelled.all_messages()` or `result.all_messages()` of an earlier attempt), which '
    'would record over that run and send its requests again. To continue it, run the same code again in the same '
    'execution: every step that ended replays. To start a new conversation from those messages, run it in '
    'another execution key, or fork the execution (pydantic-ai-durable fork).'
)

_RUN_IDS = uuid.UUID('5d1f3c2e-7a4b-4e8f-9c61-2b0d8a7e4f13')
"""The namespace of the run ids `Durable` derives (A-14); changing it changes every derived run id."""


def _is_mcp_toolset(toolset: object) -> bool:
    try:
        from pydantic_ai.mcp import MCPToolset
    except ImportError:
        return False
    return isinstance(toolset, MCPToolset)


class Durable(BaseDurabilityCapability[AgentDepsT]):
    """Journal every model request, tool call and durable operation of an agent, and replay them on retry.

    Inert outside an `execution()` scope (the agent runs exactly as without it). Inside one, each
    completed step is recorded in the journal, and a later attempt of the same execution key replays
    it instead of calling the model or the tool again. `journal=None` uses the execution's journal or
    the default `DiskJournal`.

    A run that ends with `DeferredToolRequests` (a tool that needs approval or an outside result) leaves its
    execution `waiting` on those calls; `resolve` decides them from anywhere, and running the same code
    again goes on from there with the decisions. `wait_timeout` (seconds) denies a call still
    pending that long, when the sweep next runs; a tool's or a deferral's metadata key
    `wait_timeout` sets it per call.

    A wait between polls of a batch or a background response is a journaled timer (TM-1). One longer than
    `suspend_waits_over` (seconds) ends the attempt with `ExecutionWaiting`, the execution `waiting` until the
    wait's wake-up time and holding nothing; running the same code again after it (the fleet's sweep does)
    goes on (TM-4). `None`, the default: every wait holds the attempt's process until it is over.
    """

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name='Durable',
        durable_unit_noun='step',
        durable_container_noun='journaled execution',  # pydantic-ai writes "inside a {noun}"
        codec=PAYLOAD_CODEC,
        serialization_failure=not_journalable,
        sequential_tools_in_durable_context=False,
        # refused when passed to one run: they would bypass the durable units registered at construction
        unsupported_runtime_toolset_kinds=frozenset({'function', 'mcp', 'dynamic'}),
        # a token is fired in the caller's own process, where every step runs; a cancelled run's
        # completed steps are journaled and the next attempt replays them (the releases that ask)
        **CANCELLATION_TOKENS_ACCEPTED,
        **SUSPENDING_ERRORS,  # TM-4, EV-2: a wait that ends the attempt is no failure
    )

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        secrets: SecretRegistry | None = None,
        on_divergence: DivergenceMode | None = None,
        wait_timeout: float | None = None,
        suspend_waits_over: float | None = None,
    ) -> None:
        check_divergence_mode(on_divergence)
        timeout = check_wait_timeout(wait_timeout)
        longest = check_wait_timeout(suspend_waits_over, 'Durable(suspend_waits_over=...)', what='to hold every wait')
        if journal is not None and not isinstance(journal, Journal):
            raise TypeError(
                f'Durable(journal=...) needs a journal such as MemoryJournal() or DiskJournal(path), '
                f'not {type(journal).__name__}.'
            )
        check_private_hooks()
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self.journal = journal
        self.secrets = secrets if secrets is not None else SECRETS
        self.on_divergence: DivergenceMode | None = on_divergence
        """What a run does at its first mismatch, unless the execution says otherwise."""
        self.wait_timeout = timeout
        """Seconds a deferred call may wait for a decision before the sweep denies it; `None`: for ever."""
        self.suspend_waits_over = longest
        """Seconds of a wait between polls the attempt's process may hold; a longer one ends the attempt (TM-4)."""
        self._request_models: dict[tuple[int, str | None], Model] = {}
        self._backend: DurableBackend | None = None
        self._opted_out: frozenset[str] | None = None
        self._numbered: dict[tuple[str, str], str] = {}
        """Run keys numbered by `get_default_run_id`, by execution key and the run id given, until the run starts."""

    def __repr__(self) -> str:
        return f'Durable(journal={self.journal!r}, name={self.name!r})'

    def for_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> AbstractCapability[AgentDepsT]:
        name_capability_toolsets(agent.toolsets)  # before pydantic-ai registers them by id
        return super().for_agent(agent)

    @property
    def in_durable_context(self) -> bool:
        return current_attempt() is not None

    @property
    def in_durable_unit(self) -> bool:
        """Inside a step of this capability's own run whose result is journaled, pydantic-ai's units or ours (A-13).

        pydantic-ai refuses `submit_output()` (and a wait) inside a unit it knows, since a replayed unit would not
        submit again; the leaf toolsets this package journals itself are units too, which pydantic-ai cannot see.
        """
        return in_pydantic_ai_unit() or self._in_own_step(active_run(self))

    @staticmethod
    def _in_own_step(active: ActiveRun | None) -> bool:
        """Whether the live body of one of `active`'s own steps is running: not that run's container code."""
        step = current_step()
        return active is not None and step is not None and step.run is active.run

    def get_durable_operation_backend(self) -> DurableBackend:
        # pydantic-ai asks for the backend, and binds the model operations, on every request; both depend
        # only on the names below, so one backend and one binding per model serve every request.
        # pydantic-ai binds a shallow copy per agent, so a backend (and its bindings) made for another copy
        # is never reused: each belongs to the capability object it dispatches for.
        backend = self._backend
        if backend is None or not backend.serves(self, self.name, self.default_model_id):
            backend = self._backend = DurableBackend(
                owner=self, agent_name=self.name, default_model_id=self.default_model_id, opted_out=self.opted_out
            )
        return backend

    def get_default_run_id(self) -> str | None:
        """A run id that every attempt of the execution gives the same run (A-14).

        The run is numbered here, as `start_run` would number it, and its id derives from the execution key and
        that number; the run takes the number back when it starts. Outside an execution: a fresh id.
        """
        attempt = current_attempt()
        if attempt is None:
            return None
        run_key = attempt.next_run_key(attempt.journal_for(self.journal))
        name = f'{attempt.key}\x00{run_key}'.encode('utf-8', 'surrogatepass')  # any key a journal takes (B-4)
        run_id = str(uuid.UUID(bytes=hashlib.sha1(_RUN_IDS.bytes + name).digest()[:16], version=5))
        self._numbered[(attempt.key, run_id)] = run_key
        return run_id

    async def _get_default_run_id_for_inputs(self, get_inputs: Callable[[], Mapping[str, Any]]) -> str | None:
        """`get_default_run_id`, refusing a run started again with its own messages as history (A-15).

        pydantic-ai 2.7x asks this with the run's inputs; 2.62 calls `get_default_run_id` alone, and then
        refuses such a history itself, with its own message.
        """
        run_id = self.get_default_run_id()
        if run_id is not None and any(
            recorded == run_id for recorded, _ in get_inputs().get('message_history_ids', ())
        ):
            raise DurableError(_RESTARTED.format(key=getattr(current_attempt(), 'key', '?')))
        return run_id

    def get_default_conversation_id(self, run_id: str) -> str | None:
        """The conversation id of a run that inherits none, derived from its stable run id (A-14)."""
        return conversation_id_from_run_id(run_id) if current_attempt() is not None else None

    async def before_run(self, ctx: RunContext[AgentDepsT]) -> None:
        """The base's checks, where its release lets `engine_spec` accept cancellation tokens (A-12).

        pydantic-ai 2.62 refuses every token in a durable context without asking the spec; a token is a handle
        of the caller's own process, where our steps run, so there the check is left out.
        """
        if CANCELLATION_TOKENS_ACCEPTED:
            await super().before_run(ctx)

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """Open a journal run around the agent run: number it, seed usage, fence failures (A-3)."""
        attempt = current_attempt()
        if attempt is None:
            return await super().wrap_run(ctx, handler=handler)
        start = fingerprint_run_start(ctx.prompt, ctx.messages, secrets=self.secrets)
        journal = attempt.journal_for(self.journal)
        key = self._numbered.pop((attempt.key, ctx.run_id or ''), '')  # numbered when its id was given
        run = await attempt.start_run(journal, start=start, on_divergence=self.on_divergence, key=key)
        refuse_other_start(run)  # TM-9: a run that waits on the provider is not recorded over
        spend = RunSpend(run)
        ctx.usage.incr(spend.earlier)  # U2-2: earlier attempts' spend counts before the first limit check
        ledger = ReplayUsageLedger(run_usage=ctx.usage, usage_limits=ctx.usage_limits)
        fingerprinter = ModelFingerprinter(secrets=self.secrets)
        active = ActiveRun(run, ledger, fingerprinter, spend, self.secrets, resolve_model=self._request_model)
        track_spend(spend)
        ledger.credit_first_replay(run)
        active.suspend_waits_over = self.suspend_waits_over
        active.cancelling = cancel_request(run.state.record)  # TM-10
        active.outer_sleep = graph_sleep()  # A-17, TM-1: the app's sleep, before the timer takes the graph's
        with activated(self, active), waits_on_events(active, self.wait_timeout):  # EV-1
            try:
                with traced_run(run, ctx.capabilities, lambda: spend.attempt):
                    # the base's duties, inherited; TM-1: the graph's waits are timers of this run
                    result = await super().wrap_run(ctx, handler=lambda: self._timed(handler))
            except (SimulatedCrash, ExecutionWaiting):
                raise  # a process death writes nothing; a run that waits on an event failed nothing (EV-2)
            except BaseException as error:
                try:
                    await run.fail(error, model_at_fault=isinstance(error, UnexpectedModelBehavior))
                except Exception as exc:  # the run's own error is what the caller must see
                    log.warning('Execution %r run %s: recording the failure failed (%s).', attempt.key, run.key, exc)
                raise
            finally:
                ledger.settle()
        await run.succeeded()  # F-10: what it recorded again after a failed attempt replays from now on
        waits = note_run_end(active, result, wait_timeout=self.wait_timeout)
        if attempt.cleanup == 'run' and not waits:
            await attempt.cleanup_run(run)
        return result

    async def durable_sleep(self, seconds: float) -> None:
        """Wait between polls of a background response or a batch as a journaled timer (TM-1, TM-2).

        The wake-up time is a step at the run's position, so a replayed wait sleeps only until then (not at all
        once it passed), and a wait inside one of the run's steps (a nested run in a tool) is a plain sleep.
        """
        active = active_run(self)
        if active is None or self._in_own_step(active):
            outer = active.outer_sleep if active is not None else None
            await (outer or anyio.sleep)(max(seconds, 0))  # not this run's container code: a step's body
            return
        await durable_wait(active, seconds)

    async def _timed(self, handler: WrapRunHandler) -> AgentRunResult[Any]:
        """Run the agent graph with its waits routed to `durable_sleep`, inside the base's own routing (TM-1).

        The base routes them too on 2.7x, but to a plain sleep wherever pydantic-ai's unit flag is set, which
        includes a nested run of ours inside a tool: that run's waits are container code of its own journal run.
        """
        with Agent.using_sleep(self.durable_sleep):
            return await handler()

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """The decisions `resolve` recorded for the calls the run waits on, once every one is decided."""
        active = active_run(self)
        if active is None:
            return None
        return await recorded_decisions(active, ctx, requests)

    async def _request_model(self, model_id: str | None, ctx: RunContext[Any]) -> Model:
        """The model a request goes to, resolved once per agent and model id (A-7)."""
        key = (id(self.agent), model_id)
        model = self._request_models.get(key)
        if model is None:
            model = self._request_models[key] = await resolve_request_model(self, model_id, ctx)
        return model

    async def wrap_output_process(
        self,
        ctx: RunContext[AgentDepsT],
        *,
        output_context: OutputContext,
        output: Any,
        handler: WrapOutputProcessHandler,
    ) -> Any:
        """Journal output processing that calls an output function, so a replay does not call it again (A-11)."""
        active = active_run(self)
        if active is None or not output_context.has_function or ctx.partial_output or self.agent is None:
            return await handler(output)  # streaming partials are not the result: only the final one is a step
        return await journal_output_process(active, self.name, self.agent.output_type, output_context, output, handler)

    def opted_out(self, toolset_id: str | None) -> bool:
        """Whether the agent's toolset `toolset_id` has `replayable = False`: its tools then run live every time (A-9).

        Looked up on the toolsets the agent was built with, whatever their kind: pydantic-ai hands a tool
        call only the toolset's id (a dynamic toolset's calls go to toolsets its factory makes anew).
        """
        if toolset_id is None or self.agent is None:
            return False
        opted = self._opted_out
        if opted is None:
            opted = self._opted_out = opted_out_toolsets(self.agent.toolsets)
        return toolset_id in opted

    def get_wrapper_toolset(self, toolset: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT] | None:
        """Journal the leaves pydantic-ai does not run as durable units itself, then let it wrap its own (A-8).

        Every such leaf is journaled, one given to a single run included: its steps are named and
        positioned like any other, so nothing of the run goes unjournaled (A-10). Function, dynamic and
        MCP toolsets given at run time are refused by pydantic-ai (`unsupported_runtime_toolset_kinds`),
        as they would bypass the durable units it registered when the agent was built. A
        `DurableLeafToolset` is not visited again, so the base class never wraps inside it.
        """

        def journal(leaf: AbstractToolset[AgentDepsT]) -> AbstractToolset[AgentDepsT]:
            if isinstance(leaf, (FunctionToolset, DynamicToolset)) or _is_mcp_toolset(leaf):
                return leaf
            return DurableLeafToolset(leaf, owner=self, agent_name=self.name)

        journaled = toolset.visit_and_replace(journal)
        wrapped = super().get_wrapper_toolset(journaled)
        return wrapped if wrapped is not None else journaled
