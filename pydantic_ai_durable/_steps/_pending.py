"""Runs that end with a `PendingModelResponse`: the execution waits on the provider, and the same code checks again.

With `PendingModelResponse` in its `output_type`, pydantic-ai ends a run as soon as a request is left with the
provider (a batch, a background response). Replayed, that run would end pending again for ever: the request's
recorded result is the pending response. So a replayed pending response is followed by its checks: each check
an earlier attempt made replays, and where the run last ended waiting on that job, this attempt checks it once
more, live, as a step of its own (TM-8). pydantic-ai gets the last answer in place of the pending one: still
pending, and the run ends pending again; done, and the run goes on. The request is never sent again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.output import PendingModelResponse
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from .._active_run import ActiveRun
from .._core import Run, note_provider_wait, provider_job
from .._errors import DurableError
from ._codec import Loaded
from ._model import ModelRequest
from ._pipeline import Decoder, run_step

__all__ = ('CHECK_SUFFIX', 'checked', 'note_pending_end', 'refuse_other_start')

CHECK_SUFFIX = ':check'
"""Appended to a request's step name for the steps that check on its pending response (P-3)."""


def _response(payload: object, decoder: Decoder | None) -> ModelResponse | None:
    """The response a replayed payload holds: handed on decoded (`Loaded`), or decoded here."""
    value = payload.value if isinstance(payload, Loaded) else payload
    if not isinstance(value, ModelResponse) and decoder is not None:
        try:
            value = decoder(value)
        except (TypeError, ValueError):
            return None
    return value if isinstance(value, ModelResponse) else None


async def checked(
    active: ActiveRun,
    request: ModelRequest,
    cache_key: tuple[object, ...],
    payload: object,
    dump: Callable[[Any], object],
) -> object:
    """The request's payload, or, when it replayed a pending response, that of the last check of it (TM-8).

    Checks an earlier attempt recorded replay; one more is made live only where the run ended waiting on
    this very job, and at most once per call, so an attempt never polls: it checks, and ends pending again.
    """
    if request.response is not None or not active.top_level:
        return payload  # it ran live: a new request, which pydantic-ai waits on or ends pending with itself
    decoder, hands_on = request.decoder, request.hands_on
    response = _response(payload, decoder)
    if response is None or response.state != 'suspended':
        return payload
    check = request.name + CHECK_SUFFIX
    noted = provider_job(active.run.state.record, active.run.key)  # the job the run last ended waiting on
    checked_live = False
    while response is not None and response.state == 'suspended':
        if active.run.recorded_next() != check:
            if checked_live or noted is None or response.provider_response_id != noted:
                break
            checked_live = True
        model_id, messages, settings, params, ctx = cache_key[:5]
        if checked_live and active.cancelling is not None:  # TM-10: cancel the job instead of checking it
            model = await active.resolve_model(cast('str | None', model_id), cast('RunContext[Any]', ctx))
            await model.cancel_suspended_response(response)
            active.refuse_if_cancelling()
        sent = [*cast('list[ModelMessage]', messages), response]
        key = (model_id, sent, settings, params, ctx, *cache_key[5:])
        body = _check_body(active, cast('str | None', model_id), sent, settings, params, ctx, dump)
        step = await ModelRequest.of(active, check, body, key, decoder, hands_on)
        payload = await run_step(active, step)
        response = step.response if step.response is not None else _response(payload, decoder)
    return payload


def _check_body(
    active: ActiveRun,
    model_id: str | None,
    messages: list[ModelMessage],
    settings: object,
    params: object,
    ctx: object,
    dump: Callable[[Any], object],
) -> Callable[[], Any]:
    async def check() -> object:
        model = await active.resolve_model(model_id, cast('RunContext[Any]', ctx))
        answer = await model.request(
            messages, cast('ModelSettings | None', settings), cast(ModelRequestParameters, params)
        )
        return dump(answer)

    return check


def note_pending_end(active: ActiveRun, output: object) -> bool:
    """Note whether the run ended waiting on the provider (TM-7); `True` if it did."""
    if not active.top_level:
        return False
    record = active.run.state.record
    if isinstance(output, PendingModelResponse):
        response = output.response
        note_provider_wait(record, active.run.key, response.provider_response_id or '', response.model_name)
        return True
    note_provider_wait(record, active.run.key, None, None)
    return False


def refuse_other_start(run: Run) -> None:
    """Refuse a run started with other input where the execution's run waits on the provider (TM-9).

    It would record over that run, and the call that started it, run again, would send its request again.
    """
    job = provider_job(run.state.record, run.key)
    if job is None or run.started_alike():
        return
    raise DurableError(
        f'Run {run.key} of execution {run.attempt.key!r} waits on the provider (job {job!r}): it ended with a '
        'PendingModelResponse. A run started here with other input (such as its messages as `message_history`) '
        'would record over it, and the original call would then send its request again. To check on the job, '
        'run the same code again in this key; to go on from its messages, use another key, or fork the execution.'
    )
