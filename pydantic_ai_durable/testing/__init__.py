"""Tools to prove that an agent resumes: a scripted model, crash injection and the async test harness.

`assert_replays` checks that a second run of a scenario replays everything; `crash_everywhere`
crashes it at every step boundary and checks each resume. The pytest plugin (registered through the
`pytest11` entry point) provides the `journal` fixture. Names load on first use, because pytest
imports this package in every session of anyone who installed it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._crash import CrashPlan, SimulatedCrash, crash_at
    from ._harness import assert_replays, crash_everywhere
    from ._record import SideEffects, StepRef
    from ._reports import CrashCase, CrashReport, ReplayReport
    from ._scripted import ScriptedModel, ToolCall, Turn

__all__ = (
    'CrashCase',
    'CrashPlan',
    'CrashReport',
    'ReplayReport',
    'ScriptedModel',
    'SideEffects',
    'SimulatedCrash',
    'StepRef',
    'ToolCall',
    'Turn',
    'assert_replays',
    'crash_at',
    'crash_everywhere',
)

_MODULES = {
    'CrashPlan': '_crash',
    'SimulatedCrash': '_crash',
    'crash_at': '_crash',
    'CrashCase': '_reports',
    'CrashReport': '_reports',
    'ReplayReport': '_reports',
    'assert_replays': '_harness',
    'crash_everywhere': '_harness',
    'SideEffects': '_record',
    'StepRef': '_record',
    'ScriptedModel': '_scripted',
    'ToolCall': '_scripted',
    'Turn': '_scripted',
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(f'{__name__}.{module}'), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
