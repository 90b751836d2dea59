"""Usage as pydantic-ai counts it, and its exact inverse.

Cancelling what pydantic-ai counted for a replayed step, and counting what a live step spent across
attempts, both need the same arithmetic: every counter a usage object carries (provider extras and
`details` included) added or taken off in place, a replayed response priced the way the graph prices
one, and which recorded tool outcomes pydantic-ai counts as a call at all. The ledger and the live
spend (`_spend`) share it from here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Literal

from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import RequestUsage, RunUsage

_graph_prices: Callable[[ModelResponse], None] | None
try:  # the graph's own pricing of a response; private, so an older or newer layout falls back to ours
    from pydantic_ai import _genai_prices

    _graph_prices = _genai_prices.fill_response_cost
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed pydantic-ai
    _graph_prices = None

__all__ = (
    'SUCCESSFUL_TOOL_RESULT_KINDS',
    'add_usage',
    'counter_fields',
    'counter_names',
    'is_successful_tool_payload',
    'price_response',
    'subtract_request_usage',
    'subtract_usage',
)

SUCCESSFUL_TOOL_RESULT_KINDS: frozenset[str] = frozenset({'tool_return', 'tool_content_result'})
"""Recorded tool outcomes pydantic-ai counts as a call; retries, failures and deferrals are not counted."""

_NON_COUNTER_FIELDS = frozenset({'details', 'cost'})


_COUNTER_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def counter_fields(usage_type: type[RequestUsage | RunUsage]) -> tuple[str, ...]:
    """The numeric fields a usage class declares, found by introspection so new counters are covered."""
    names = _COUNTER_FIELDS.get(usage_type)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(usage_type) if f.name not in _NON_COUNTER_FIELDS)
        _COUNTER_FIELDS[usage_type] = names
    return names


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float))


def counter_names(usage: RequestUsage | RunUsage) -> list[str]:
    """Declared counters plus any provider-specific counters carried as extra attributes.

    pydantic-ai keeps unknown usage keys (e.g. a provider's `web_searches`) as attributes and sums
    them when it adds usage, so they have to be taken back too.
    """
    declared = counter_fields(type(usage))
    extra = [name for name in vars(usage) if name not in declared and name not in _NON_COUNTER_FIELDS]
    return [*declared, *extra]


def _shift_usage(run_usage: RunUsage, usage: RequestUsage | RunUsage, sign: Literal[1, -1]) -> None:
    for name in counter_names(usage):
        value = getattr(usage, name, 0)
        current = getattr(run_usage, name, 0)
        if _is_number(value) and _is_number(current):
            setattr(run_usage, name, current + sign * value)
    for key, value in usage.details.items():
        if _is_number(value):  # providers sometimes report None despite the annotation
            run_usage.details[key] = run_usage.details.get(key, 0) + sign * value
    if usage.cost is not None:
        run_usage.cost = (run_usage.cost or Decimal(0)) + sign * usage.cost


def subtract_usage(run_usage: RunUsage, usage: RequestUsage | RunUsage) -> None:
    """Take one response's usage, or an operation's accumulated `RunUsage` delta, off `run_usage` in place (U-2).

    It is the exact inverse of the add pydantic-ai is about to do, so every counter the usage object
    carries is covered, `details` key by key, and the cost only when the subtracted usage has one.
    `requests`/`tool_calls` move only when `usage` is a `RunUsage` (a `RequestUsage` never adds them).
    """
    _shift_usage(run_usage, usage, -1)


subtract_request_usage = subtract_usage
"""The name the rulebook uses for `subtract_usage`."""


def add_usage(run_usage: RunUsage, usage: RequestUsage | RunUsage) -> None:
    """Add `usage` to `run_usage` in place: the inverse of `subtract_usage`, under the same rules.

    The ledger uses it to give back a subtraction that turned out too large, such as the previous
    segment of a background job that is polled again.
    """
    _shift_usage(run_usage, usage, 1)


def price_response(response: ModelResponse) -> None:
    """Price a response in place, with the function the graph prices every response it receives with (U-3).

    The graph never prices a response that already has a cost. A live response priced here before its entry
    is written costs one genai-prices lookup (about 0.2 ms for a known model), not one here and one in the
    graph, and its replay carries the recorded price. A replayed response without one (an entry written
    before prices were recorded) is priced here, before the ledger cancels it, or the graph would add a
    price the ledger never took off. Pricing is best effort, as in the graph.
    """
    if _graph_prices is None:
        _price_like_the_graph(response)
        return
    with contextlib.suppress(Exception):
        _graph_prices(response)


def _price_like_the_graph(response: ModelResponse) -> None:
    """The graph's pricing rule, for a pydantic-ai whose private pricing function is not where it is today.

    The same genai-prices lookup, with the rule that a response with unmeasured usage keeps a positive
    price but not a zero one; anything it cannot price is left alone.
    """
    usage = response.usage
    if usage.cost is not None or not response.model_name:
        return
    try:
        if usage.unmeasured_requests:
            # `ModelResponse.cost()` refuses usage with unmeasured requests, but the graph still prices it
            # as a lower bound; pricing a copy without the marker gives the same figure.
            measured = copy.copy(usage)
            measured.unmeasured_requests = 0
            price = dataclasses.replace(response, usage=measured).cost().total_price
            if price == 0:
                return
        else:
            price = response.cost().total_price
    except Exception:
        return
    usage.cost = price


def is_successful_tool_payload(payload: object) -> bool:
    """Whether a recorded tool payload is an outcome pydantic-ai counts in `tool_calls` (U-4).

    Retries, failures, approvals and deferrals replay too, but the tool manager does not count them,
    so there is nothing to cancel for them.
    """
    return isinstance(payload, Mapping) and payload.get('kind') in SUCCESSFUL_TOOL_RESULT_KINDS
