"""The agent the external-event tests run (EV): a refund needs approval, which a token handler asks for.

`HandleDeferredToolCalls` with a handler that takes a resume token answers the approval: by `policy`, it hands
the token on (writes it to the file `token` beside the log, returns `None`), approves in place, or denies in
place. Every model request, every `ask` and every refund appends a line to the log, so a test counts what
really ran, across processes too.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolDenied
from waiting_agent import lines, note, summary

from pydantic_ai_durable import Durable, Journal

KEY = 'order-9'
PROMPT = 'refund order 9'
WAIT = 'approve_refund'


def token_file(log: Path) -> Path:
    return log.parent / 'token'


def build(
    journal: Journal | None, log: Path, *, policy: str = 'hand-on', timeout: timedelta | None = None, **durable: Any
) -> Agent[None, str]:
    from pydantic_ai.capabilities import HandleDeferredToolCalls

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        note(log, 'model')
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[ToolCallPart('refund', {'amount': 5}, tool_call_id='c1')])
        return ModelResponse(parts=[TextPart(summary(messages))])

    def ask(ctx: RunContext[None], requests: DeferredToolRequests, token: str) -> DeferredToolResults | None:
        note(log, f'ask {policy}')
        if policy == 'kill':
            os.kill(os.getpid(), signal.SIGKILL)
        if policy == 'approve':
            return requests.build_results(approve_all=True)
        if policy == 'deny':
            return requests.build_results(
                approvals={c.tool_call_id: ToolDenied('policy now says no') for c in requests.approvals}
            )
        token_file(log).write_text(token)
        return None

    capabilities: list[Any] = [HandleDeferredToolCalls(ask, name=WAIT, timeout=timeout)]
    if journal is not None:
        capabilities.append(Durable(journal, **durable))
    agent: Agent[None, str] = Agent(
        FunctionModel(model, model_name='events'), name='refunds', capabilities=capabilities
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        note(log, f'refund {amount}')
        return f'refunded {amount}'

    return agent


__all__ = ('KEY', 'PROMPT', 'WAIT', 'build', 'lines', 'token_file')
