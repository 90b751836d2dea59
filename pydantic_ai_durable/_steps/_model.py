"""A model request as a step: fingerprinted as the model will see it, its response counted before it is encoded.

What a model request does its own way in the pipeline (A-6): its fingerprint is the request as the
serving model sees it, the usage ledger settles its credits before the claim and is credited for a
replay, the request is counted before it goes out and the response's tokens before it is encoded, so
they ride in the entry's commit (U2-1), and the entry records what the request added to the conversation.
A request that fails with a `ModelAPIError` is recorded with that error as its outcome, raised again by a
replay (A-16); the success path does no work for it but a `try` and an attribute read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from .._active_run import ActiveRun
from .._core import Kind, Step
from .._fingerprint import Renderings
from ._codec import HOLD_RESPONSES, Unencoded
from ._model_errors import error_payload, recorded_error
from ._pipeline import Body, Decoder, StepKind

__all__ = ('ModelRequest',)


@dataclass
class ModelRequest(StepKind):
    """One model request of a run (streamed or not); `of` builds it from what pydantic-ai hands the backend."""

    journal_kind: ClassVar[Kind] = 'model'

    body: Body
    model_id: str | None
    messages: list[ModelMessage]
    settings: ModelSettings | None
    params: ModelRequestParameters
    ctx: RunContext[Any]
    request_fingerprint: str | None
    """The request's fingerprint as the serving model sees it, computed by `of`."""
    renderings: Renderings
    """What computing the fingerprint rendered of the messages, reused to record what the request sent."""
    continuation: bool = field(default=False, init=False)
    """It continues a suspended response: not a new request for pydantic-ai's count."""
    had_credit: bool = field(default=False, init=False)
    """The ledger had credited it as a replay before pydantic-ai's limit check."""
    start: int = field(default=0, init=False)
    """Where in the history what this request adds to the conversation starts."""
    response: ModelResponse | None = field(default=None, init=False)
    """The live response, as the codec handed it back before encoding it."""
    snapshot: dict[str, Any] | None = field(default=None, init=False)
    """The spend snapshot that counts the live response, stored with the entry."""
    error: ModelAPIError | None = field(default=None, init=False)
    """The error the request failed with, live or as recorded: its outcome, raised once its step is done (A-16)."""
    failing_from: int | None = field(default=None, init=False)
    """Where the model steps that failed in a row up to this one began: a run the error fails is fenced there."""

    @classmethod
    async def of(
        cls,
        active: ActiveRun,
        name: str,
        body: Body,
        cache_key: tuple[object, ...],
        decoder: Decoder | None,
        hands_on: bool,
    ) -> ModelRequest:
        """The step of a request, fingerprinted here: the serving model, which the fingerprint needs, is awaited."""
        model_id, messages, settings, params, ctx = cache_key[:5]
        model_id = cast('str | None', model_id)
        messages = cast('list[ModelMessage]', messages)
        settings = cast('ModelSettings | None', settings)
        params = cast(ModelRequestParameters, params)
        ctx = cast('RunContext[Any]', ctx)
        fingerprint, earlier = await active.fingerprint_model_request(model_id, messages, settings, params, ctx)
        renderings = active.fingerprinter.take_renderings()
        step = cls(
            name, True, decoder, hands_on, body, model_id, messages, settings, params, ctx, fingerprint, renderings
        )
        step.earlier = earlier
        return step

    def fingerprint(self, active: ActiveRun) -> str | None:
        messages = self.messages
        self.continuation = active.ledger.begin_model_request(messages)
        self.had_credit = active.ledger.settle()
        self.start = active.sent_upto if active.sent_upto <= len(messages) else 0  # a processor may have cut it
        active.sent_upto = len(messages) + 1
        return self.request_fingerprint

    def decode(self, payload: object) -> object:
        try:
            return _decoded_response(payload, self.decoder)  # rejected if it no longer loads
        except (TypeError, ValueError):
            error = recorded_error(payload)  # a recorded failure holds no response
            if error is None:
                raise
            self.error = error
            return error

    def replayed(self, active: ActiveRun, step: Step, value: object) -> object:
        if self.error is not None:
            raise self._failed(active, step)  # pydantic-ai counted nothing for it, so the ledger has nothing to do
        decoded, response = cast('tuple[object, ModelResponse]', value)
        ledger = active.ledger
        # The response handed on is the one priced here (U-3), so pydantic-ai does not price it again.
        ledger.record_model_replay(response, continuation=self.continuation)
        ledger.track_chain(response, self.params)
        if response.state != 'suspended':
            ledger.credit_successors(active.run, step.position)
        return super().replayed(active, step, decoded)

    async def going_live(self, active: ActiveRun, step: Step) -> None:
        active.ledger.record_live_model_request(had_request_credit=self.had_credit)  # may stop the request
        await active.spend.request_sent(continuation=self.continuation)
        # What this request added to the conversation, so the run reads back as messages (XP-5).
        added = self.messages[self.start :]
        rendered = self.renderings.of(added)  # one dump of each new message, not two (issue 51)
        if rendered is None:
            rendered = cast('list[Any]', active.mask(ModelMessagesTypeAdapter.dump_python(added, mode='json')))
        sent: dict[str, Any] = {'from': self.start, 'messages': rendered}
        if _STAMPS_MODEL_ID:  # the agent stamps it on the response after this step recorded it
            sent['model_id'] = _serving_model_id(self.model_id, self.ctx)
        self.sent = sent

    async def live(self, active: ActiveRun) -> object:
        # The codec hands the response back unencoded: its tokens are counted before it is encoded, and
        # written with its entry, in the step's one commit (UW-1).
        token = HOLD_RESPONSES.set(True)
        try:
            result = await self.body()
        except ModelAPIError as error:
            payload = error_payload(error)
            if payload is None:
                raise  # not recorded: the request is sent again on the next attempt
            self.error = error
            self.sent = None  # a failed request added nothing to the conversation
            return payload
        finally:
            HOLD_RESPONSES.reset(token)
        if not isinstance(result, Unencoded):
            return result  # another pydantic-ai encoded it itself: `spent` decodes it
        self.response = result.response
        self.snapshot = active.spend.response_received(result.response, continuation=self.continuation)
        try:
            return result.encode()
        except Exception:
            await active.spend.persist(self.snapshot)  # billed, and no entry will carry it
            raise

    def spent(self, active: ActiveRun, payload: object) -> dict[str, Any] | None:
        if self.snapshot is not None:
            return self.snapshot
        if self.error is not None:
            return None  # the request was counted when it was sent (U2-1); a failure reports no tokens
        try:
            self.response = _decoded_response(payload, self.decoder)[1]
        except (TypeError, ValueError):
            self.response = None
        return active.spend.response_received(self.response, continuation=self.continuation)

    def finished(self, active: ActiveRun, step: Step, payload: object) -> object:
        if self.error is not None:
            raise self._failed(active, step)
        if self.response is not None:
            active.ledger.track_chain(self.response, self.params)
            active.ledger.credit_argument_matches(active.run, self.response, self.params)  # calls that replay
        return payload

    def fails_from(self, error: BaseException) -> int | None:
        return self.failing_from if error is self.error else None

    def _failed(self, active: ActiveRun, step: Step) -> ModelAPIError:
        """The recorded error, to raise, failing from where the failures in a row began (F-2 through `fails_from`).

        A run it fails then sends every request of the failed streak again (a fallback's chain, or a retry's
        attempts, each with its full budget), instead of replaying its way into the same failure. The streak
        is the failed model steps at consecutive positions, a timer between them included (a retry's backoff,
        TM-1): any other step between them ends it.
        """
        error = self.error
        assert error is not None
        active.sent_upto = self.start  # the request that follows sends the same messages again
        position = step.position
        streak = active.failed_streak
        first = streak[0] if streak is not None and streak[1] == position - 1 else position
        active.failed_streak = (first, position)
        self.failing_from = first
        return error


_STAMPS_MODEL_ID = 'model_id' in {f.name for f in dataclasses.fields(ModelResponse)}
"""Whether this pydantic-ai stamps a response with the id of the model it was sent to (2.68 on)."""


def _serving_model_id(model_id: str | None, ctx: RunContext[Any]) -> str | None:
    """The id pydantic-ai stamps on a response: the model's registry key or string, else the model's own id."""
    return model_id or getattr(ctx, 'model_id', None) or ctx.model.model_id


def _decoded_response(payload: object, decode: Decoder | None) -> tuple[object, ModelResponse]:
    """A model payload decoded, with the `ModelResponse` in it (a streamed result wraps it under `response`).

    Raises `ValueError` when the payload no longer loads or holds no response: a replay is then rejected.
    """
    value = decode(payload) if decode is not None else payload
    if isinstance(value, ModelResponse):
        return value, value
    inner = getattr(value, 'response', None)
    if not isinstance(inner, ModelResponse):
        raise ValueError(f'a recorded model payload decodes to {type(value).__name__}, which holds no ModelResponse')
    return value, inner
