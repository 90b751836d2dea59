"""Shared building blocks for the end-to-end tests: counting models and tools, journals per backend."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from packaging.requirements import Requirement
from pydantic import TypeAdapter
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RequestUsage

from pydantic_ai_durable import Durable, Journal
from pydantic_ai_durable.journals import Lease, LeaseRenewal

_ARGS = TypeAdapter(dict[str, Any]).validator


def harness_mismatch() -> str | None:
    """Why pydantic-ai-harness cannot be tested here: no pydantic-ai-harness, or one made for another pydantic-ai.

    Each pydantic-ai-harness release pins one pydantic-ai-slim release (0.62.0, the newest, pins 2.62.0), so
    on any other pydantic-ai there is no harness that fits and its tests run only where one does.
    """
    try:
        harness = metadata.version('pydantic-ai-harness')
    except metadata.PackageNotFoundError:
        return 'pydantic-ai-harness is not installed (no release of it fits this pydantic-ai-slim)'
    slim = metadata.version('pydantic-ai-slim')
    for line in metadata.requires('pydantic-ai-harness') or []:
        requirement = Requirement(line)
        fits = requirement.specifier.contains(slim, prereleases=True)
        if requirement.name == 'pydantic-ai-slim' and requirement.marker is None and not fits:
            return f'pydantic-ai-harness {harness} needs pydantic-ai-slim{requirement.specifier}, not {slim}'
    return None


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]


def responses(messages: list[ModelMessage]) -> int:
    return sum(isinstance(message, ModelResponse) for message in messages)


@dataclass
class Calls:
    """Counts calls by name; the counters are what a replay must not increase."""

    counts: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> int:
        self.counts[name] = self.counts.get(name, 0) + 1
        return self.counts[name]

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)


def two_step_model(
    calls: Calls, *, fail_final: bool = False, usages: tuple[RequestUsage, ...] = (), model_name: str = 'two-step'
) -> FunctionModel:
    """Asks for `query` once, then answers with what it returned (the two-step agent most tests use)."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.hit('model')
        turn = responses(messages)
        usage = usages[turn] if turn < len(usages) else None
        if turn == 0:
            response = ModelResponse(parts=[ToolCallPart('query', {'sql': 'select 3'}, tool_call_id='q1')])
        else:
            if fail_final:
                raise RuntimeError('model crashed')
            response = ModelResponse(parts=[TextPart(f'answer: {tool_returns(messages)[-1].content}')])
        if usage is not None:
            response.usage = usage
        return response

    return FunctionModel(model, model_name=model_name)


def two_step_agent(
    journal: Journal | None,
    calls: Calls,
    *,
    fail_final: bool = False,
    usages: tuple[RequestUsage, ...] = (),
    model_name: str = 'two-step',
    **agent_kwargs: Any,
) -> Agent[None, str]:
    """The two-step agent; `usages` are what its responses report, and a known `model_name` (gpt-4o) prices them."""

    def query(sql: str) -> str:
        calls.hit('tool')
        return '3 rows'

    return Agent(
        two_step_model(calls, fail_final=fail_final, usages=usages, model_name=model_name),
        name='two_step',
        toolsets=[FunctionToolset([query], id='db')],
        capabilities=[Durable(journal=journal)],
        **agent_kwargs,
    )


JournalFactory = Callable[[], Journal]
_T = TypeVar('_T')


class Warehouse(AbstractToolset[Any]):
    """A custom leaf toolset: pydantic-ai runs it as-is, so only `Durable` can journal it."""

    def __init__(self, tools: dict[str, Callable[..., Any]], *, id: str = 'warehouse', replayable: bool = True) -> None:
        self.tools = tools
        self._id = id
        self.replayable = replayable

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(name=name, parameters_json_schema={'type': 'object'}),
                max_retries=1,
                args_validator=_ARGS,
            )
            for name in self.tools
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        return self.tools[name](**tool_args)


class Operator:
    """A journal whose writes each take a lease of their own, as an operator editing a journal would.

    Every write of the protocol is fenced by a lease epoch (B-9). Tests about what storage keeps, or
    that plant entries between attempts, use this view: each write acquires the execution's lease
    (failing if a live attempt holds it), writes with its epoch, and gives the lease back, so listings
    and prune see no lease afterwards. Lease behaviour itself is tested on the raw journal.
    """

    HOLDER = 'tests-operator'
    """Not in this release's holder format, so no store can prove it dead: only its expiry frees it."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def __getattr__(self, name: str) -> Any:
        return getattr(self.journal, name)

    def __repr__(self) -> str:
        return f'Operator({self.journal!r})'

    async def _leased(self, key: str, write: Callable[[int], Awaitable[_T]]) -> _T:
        lease = await self.journal.acquire_lease(key, self.HOLDER, 60)
        assert lease.holder == self.HOLDER, f'a live attempt holds {key!r}: {lease}'
        try:
            return await write(lease.epoch)
        finally:
            await self.journal.release_lease(key, self.HOLDER, lease.epoch)

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any]) -> bool:
        return await self._leased(key, lambda epoch: self.journal.write_entry(key, run, position, entry, epoch=epoch))

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any]) -> bool:
        return await self._leased(key, lambda epoch: self.journal.write_record(key, run, name, value, epoch=epoch))

    async def write_execution(self, key: str, value: dict[str, Any]) -> bool:
        return await self._leased(key, lambda epoch: self.journal.write_execution(key, value, epoch=epoch))

    async def delete_run(self, key: str, run: str) -> None:
        await self._leased(key, lambda epoch: self.journal.delete_run(key, run, epoch=epoch))

    async def delete_execution(self, key: str) -> None:
        await self._leased(key, lambda epoch: self.journal.delete_execution(key, epoch=epoch))


async def renew(journal: Journal, key: str, holder: str, epoch: int, ttl: float) -> Lease | None:
    """Renew one lease through the batch call every renewer uses (CC-2), and return the lease now in force."""
    [lease] = await journal.renew_leases([LeaseRenewal(key, holder, epoch, ttl)])
    return lease


def elsewhere(coro: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    """Run `coro` as another attempt would: in a task of this loop, outside every execution scope around it.

    A task normally inherits the scope it was started in, and an execution cannot be entered inside
    itself (FN-5); another process's attempt shares nothing with this one, so its task starts from an
    empty context.
    """
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
