"""Stored epoch times as text, whatever their value (WT-5).

A deadline is the time a call was deferred plus a timeout the app chose, and a record may be written by
anyone who can write the store, so a stored time may lie beyond the calendar `datetime` knows (after the
year 9999). Every place that shows a time (`show`, `list --json`, the console) renders it here, or through
`utc_moment` in its own format, so such a time is shown as its epoch seconds instead of ending the command.
"""

from __future__ import annotations

import datetime

__all__ = ('beyond_calendar', 'utc_moment', 'utc_text')


def utc_moment(epoch: float) -> datetime.datetime | None:
    """`epoch` as an aware UTC `datetime`, or `None` for a time the calendar cannot hold."""
    try:
        return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    except (ValueError, OverflowError, OSError):
        return None


def beyond_calendar(epoch: float) -> str:
    """What is shown for a time `utc_moment` cannot hold."""
    return f'{epoch:g} epoch seconds (beyond the calendar)'


def utc_text(epoch: float | None, timespec: str = 'milliseconds') -> str | None:
    """ISO 8601 in UTC (`2026-12-07T15:07:44.447Z`), `beyond_calendar` text, or `None` for no time."""
    if epoch is None:
        return None
    moment = utc_moment(epoch)
    if moment is None:
        return beyond_calendar(epoch)
    return moment.isoformat(timespec=timespec).replace('+00:00', 'Z')
