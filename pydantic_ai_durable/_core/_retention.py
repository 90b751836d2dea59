"""Which retention an execution gets, and the small JSON object it may carry (FN-4).

The period is the execution's (`execution(retention=...)`), else its journal's (`DiskJournal(retention=...)`
and the others), else seven days; `None` keeps it until it is pruned by hand. `FROM_JOURNAL` is the
default that says "the journal's".
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from .._errors import MetadataMismatch

__all__ = ('FROM_JOURNAL', 'METADATA_LIMIT', 'check_metadata', 'check_same_work')


class _FromJournal:
    """The default of `execution(retention=...)`: the retention of the execution's journal."""

    def __repr__(self) -> str:
        return "the journal's"


FROM_JOURNAL: Any = _FromJournal()

METADATA_LIMIT = 16 * 1024
"""The most bytes of JSON an execution's metadata may take: it is read with every listing."""


def check_metadata(metadata: object) -> dict[str, Any] | None:
    """A JSON copy of `metadata`, checked before anything runs: a JSON object of at most `METADATA_LIMIT` bytes."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(isinstance(key, str) for key in metadata):
        raise TypeError(
            f'execution(metadata=...) must be a dict with str keys (a JSON object), not {type(metadata).__name__}.'
        )
    try:
        text = json.dumps(metadata, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f'execution(metadata=...) must hold only JSON data (str, int, float, bool, None, lists and dicts): {exc}. '
            'Nothing ran.'
        ) from None
    if len(text.encode('utf-8')) > METADATA_LIMIT:
        raise ValueError(
            f'execution(metadata=...) takes {len(text.encode("utf-8"))} bytes as JSON, more than {METADATA_LIMIT}: '
            'keep what a worker needs to restart the execution (ids, not documents). Nothing ran.'
        )
    copy: dict[str, Any] = json.loads(text)
    return copy


def check_same_work(key: str, recorded: object, given: dict[str, Any] | None, fixed: Collection[str]) -> None:
    """Raise `MetadataMismatch` when a field of `fixed` differs between the recorded metadata and `given` (FL-12).

    Nothing is compared while the execution has recorded no metadata (a first attempt, or one started
    without any): there is no work to differ from.
    """
    if not fixed or not isinstance(recorded, dict) or given is None:
        return
    differing = [name for name in fixed if recorded.get(name) != given.get(name)]
    if differing:
        raise MetadataMismatch(
            key,
            recorded={name: recorded.get(name) for name in differing},
            given={name: given.get(name) for name in differing},
        )
