"""Answers to pydantic-ai-harness's `AskUser` questions, checked against the question they answer (WT-6).

One check for every way a person answers: `resolve()`, the CLI's `complete` and the console's forms and API.
It lives apart from `_decisions` because the CLI and the console load without pydantic-ai: this module
imports pydantic and pydantic-ai-harness only when a question is answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ._core import pending_calls
from ._errors import ResolutionRefused
from .journals import CallDecision, DeferredCall, Journal

if TYPE_CHECKING:
    from pydantic_ai_harness.ask_user import AskUserRequest, AskUserResponse

__all__ = ('answered', 'ask_user_request', 'is_ask_user_response')


def is_ask_user_response(value: object) -> bool:
    """Whether `value` is a person's `AskUserResponse` (never, without pydantic-ai-harness installed)."""
    try:
        from pydantic_ai_harness.ask_user import AskUserResponse
    except ImportError:
        return False
    return isinstance(value, AskUserResponse)


async def answered(journal: Journal, key: str, decisions: Mapping[str, CallDecision]) -> dict[str, CallDecision]:
    """`decisions`, each result for a question of pydantic-ai-harness's `AskUser` checked against it (WT-6).

    The one check of an answer, whoever gives it: `resolve()`, the CLI's `complete` and the console. An answer
    is the person's `AskUserResponse` (or its JSON), or what the tool itself returns (each header with the
    labels picked, `{"Seat": ["Aisle"]}`, or `DECLINED`; a custom answer only as a response, since a mistyped
    label would read as one). It is checked with the harness's `ask_user_result` and recorded as what that
    returns; one that does not fit its question is a `ResolutionRefused`, and nothing is written. Results for
    other calls pass unchanged; an unknown call is left for `resolve_calls` to refuse.
    """
    checked = dict(decisions)
    if not any(decision.kind == 'result' for decision in decisions.values()):
        return checked
    calls: dict[str, DeferredCall] = {}
    for recorded in await pending_calls(journal, key, decided=True):  # oldest first: a pending call wins (WT-7)
        for name in (recorded.call_id, recorded.ref):
            if recorded.pending or name not in calls or not calls[name].pending:
                calls[name] = recorded
    for call_id, decision in decisions.items():
        call = calls.get(call_id)
        if decision.kind != 'result' or call is None:
            continue
        if call.request is not None:
            checked[call_id] = replace(decision, value=_answer(key, call, decision.value))
        elif is_ask_user_response(decision.value):
            raise ResolutionRefused(
                key, call_id, f'call {call_id!r} ({call.tool_name}) is not a question of AskUser: give it its result'
            )
    return checked


def _answer(key: str, call: DeferredCall, value: object) -> Any:
    """The answer to an `AskUser` question, checked against it and rendered as the tool's result."""
    try:
        from pydantic_ai_harness.ask_user import ask_user_result
    except ImportError:
        raise ResolutionRefused(
            key,
            call.call_id,
            f"call {call.call_id!r} is a question of pydantic-ai-harness's AskUser, and its answer is checked "
            'against the question with pydantic-ai-harness, which is not installed here',
        ) from None
    request = ask_user_request(call)
    headers = ', '.join(repr(question.header) for question in request.questions)
    try:
        return ask_user_result(request, _response(request, value))  # JSON already: labels by header, or a text
    except ValueError as exc:  # a `ValidationError` too
        reason = ' '.join(str(exc).split())[:300]
        raise ResolutionRefused(
            key,
            call.call_id,
            f'the answer to question {call.call_id!r} does not fit it ({reason}): answer each of its questions '
            f'({headers}) with labels it offers, as {{"<header>": ["<label>", ...]}}; a custom answer as '
            '{"answers": [{"header": "<header>", "custom_answer": "<text>"}]}; or decline with {"cancelled": true}',
        ) from None


def _response(request: AskUserRequest, value: object) -> AskUserResponse:
    """The person's response an answer stands for: given as one, as its JSON, or as the tool's result."""
    from pydantic import TypeAdapter
    from pydantic_ai_harness.ask_user import DECLINED, AskUserAnswer, AskUserResponse

    if isinstance(value, AskUserResponse):
        return value
    if value == DECLINED:
        return AskUserResponse(cancelled=True)
    if not isinstance(value, dict) or not value:
        raise ValueError('it is neither a response ({"answers": [...]}) nor the result the tool gives')
    questions = {question.header: question for question in request.questions}
    if set(value) <= {'answers', 'cancelled'} and not set(value) & set(questions):
        return TypeAdapter(AskUserResponse).validate_python(value)
    answers: list[AskUserAnswer] = []
    for header, picked in value.items():
        if not isinstance(picked, list) or not all(isinstance(label, str) for label in picked):
            raise ValueError(f'the answer for {header!r} is not a list of labels')
        # Labels only: the tool gives a custom answer the same way, so a mistyped label would pass for one.
        answers.append(AskUserAnswer(header=header, selected=tuple(picked)))
    return AskUserResponse(answers=tuple(answers))


def ask_user_request(call: DeferredCall) -> AskUserRequest:
    """The validated `AskUserRequest` behind a waiting `ask_user_question` call: the questions to put to the person.

    Raises `ValueError` for a call of another tool.
    """
    from pydantic import TypeAdapter
    from pydantic_ai_harness.ask_user import AskUserRequest

    if call.request is None:
        raise ValueError(f'Call {call.call_id!r} ({call.tool_name}) is not a question of AskUser.')
    return TypeAdapter(AskUserRequest).validate_python(call.request)
