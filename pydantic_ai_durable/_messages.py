"""A recorded run as pydantic-ai messages, ready to hand to any agent as `message_history`.

The journal core rebuilds the conversation as JSON; this layer loads it with pydantic-ai's own adapter,
so what comes back is what the run's `all_messages()` held at that step, secrets masked as they were
recorded. Another prompt or another model can then continue a real production conversation for free.
"""

from __future__ import annotations

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from ._core import recorded_conversation
from .journals import Journal

__all__ = ('recorded_messages',)


async def recorded_messages(
    journal: Journal, key: str, *, run: str = '0', until: int | None = None
) -> list[ModelMessage]:
    """The messages of run `run` of execution `key` before step `until` (the whole run by default).

    Steps are numbered as `pydantic-ai-durable show` numbers them. Raises `LookupError` for an unknown
    execution or run.
    """
    return ModelMessagesTypeAdapter.validate_python(await recorded_conversation(journal, key, run=run, until=until))
