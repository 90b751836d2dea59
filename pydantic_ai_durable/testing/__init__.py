"""Tools to prove that an agent resumes: a scripted model and crash injection.

Also a pytest plugin (registered through the `pytest11` entry point) that provides the `journal`
fixture.
"""

from ._crash import CrashPlan, SimulatedCrash, crash_at
from ._scripted import ScriptedModel, ToolCall, Turn

__all__ = ('CrashPlan', 'ScriptedModel', 'SimulatedCrash', 'ToolCall', 'Turn', 'crash_at')
