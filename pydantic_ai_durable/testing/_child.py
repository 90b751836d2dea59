"""The child side of `crash_everywhere(kill=True)`: import the scenario once, fork one process per attempt.

Started as `python -m pydantic_ai_durable.testing._child` with its configuration in the environment
variable `PYDANTIC_AI_DURABLE_HARNESS`. It reads one JSON command per line on stdin (an execution key,
an event file and the crash to inject), forks, and answers with the attempt's exit status. A forked
attempt is a real process: the injected crash is SIGKILL, and the events it appended to its file
before dying are all the parent learns, exactly as after a real crash.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, NoReturn, cast

from pydantic_core import to_jsonable_python

from ..journals import DiskJournal, Journal
from ._crash import CrashPlan
from ._record import Event, Recorder, run_recorded

__all__ = ('ENV', 'build_journal', 'encode_output', 'load_target', 'main')

ENV = 'PYDANTIC_AI_DURABLE_HARNESS'

Scenario = Callable[[], Awaitable[Any]]


def _import(module_name: str, file: str | None) -> ModuleType:
    if module_name.endswith('.py'):
        file, module_name = module_name, os.path.splitext(os.path.basename(module_name))[0]
    else:
        try:
            return importlib.import_module(module_name)
        except ImportError:
            if file is None:
                raise
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f'cannot load {module_name!r} from {file!r}')
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def load_target(target: str, file: str | None) -> Scenario:
    """The callable named by `'package.module:function'` (or `'path/to/file.py:function'`)."""
    module_name, _, attribute = target.rpartition(':')
    if not module_name or not attribute:
        raise ValueError(f"A scenario import path looks like 'package.module:function', not {target!r}.")
    value: Any = _import(module_name, file)
    for part in attribute.split('.'):
        value = getattr(value, part)
    if not callable(value):
        raise TypeError(f'{target!r} is not callable.')
    return cast(Scenario, value)


def build_journal(spec: dict[str, Any]) -> Journal:
    """The journal a spec describes: a directory for `DiskJournal`, or a factory to import and call."""
    if 'factory' in spec:
        module_name, _, attribute = str(spec['factory']).rpartition(':')
        factory: Any = importlib.import_module(module_name)
        for part in attribute.split('.'):
            factory = getattr(factory, part)
        journal = factory()
        if not isinstance(journal, Journal):
            raise TypeError(f'journal_factory {spec["factory"]!r} returned {journal!r}, not a journal.')
        return journal
    return DiskJournal(spec['disk'], durability=spec.get('durability', 'process'))


def encode_output(value: Any) -> Any:
    """The output as JSON data, so outputs produced by two processes can be compared."""
    return json.loads(json.dumps(to_jsonable_python(value, fallback=repr)))


def _reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + '\n')
    sys.stdout.flush()


def _attempt(scenario: Scenario, journal_spec: dict[str, Any], command: dict[str, Any]) -> NoReturn:
    """Run one attempt in the forked process and leave with `os._exit`, never returning to the loop."""
    code = 0
    try:
        log = os.open(command['log'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        events = os.open(command['events'], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def emit(event: Event) -> None:
            # One unbuffered write per event: what the kernel has survives the SIGKILL that follows.
            os.write(events, (json.dumps(event, default=repr) + '\n').encode())

        crash = command.get('crash')
        plan = None
        if crash is not None:
            plan = CrashPlan(
                position=crash['position'], name=crash['name'], run=crash['run'], point=crash['point'], kill=True
            )
        journal = build_journal(journal_spec)
        recorder = Recorder(emit, plan)

        async def attempt() -> None:
            try:
                await run_recorded(
                    scenario, journal=journal, key=command['key'], recorder=recorder, encode=encode_output
                )
            finally:
                await journal.close()

        asyncio.run(attempt())
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _warm_up() -> None:
    """Run a throwaway agent once, so each forked attempt starts with pydantic-ai's lazy imports done.

    A first run in a fresh process costs several times a later one (imports, schema builds); doing it
    once here, with none of the user's code, makes every fork start warm. Best effort: it may fail.
    """
    try:
        from pydantic_ai import Agent

        from .._capability import Durable
        from .._execution import execution
        from ..journals import MemoryJournal
        from ._scripted import ScriptedModel, ToolCall

        agent = Agent(ScriptedModel([[ToolCall('echo', {'x': 1})], 'ok']), name='warm_up', capabilities=[Durable()])

        @agent.tool_plain
        def echo(x: int) -> int:
            return x

        async def run() -> None:
            async with execution('warm-up', journal=MemoryJournal()):
                await agent.run('warm up')

        asyncio.run(run())
        for thread in threading.enumerate():  # the lease renewer ends once told; fork without it
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)
    except Exception:
        pass


def main() -> None:
    config = json.loads(os.environ[ENV])
    sys.path[:0] = [path for path in config['sys_path'] if path not in sys.path]
    try:
        scenario = load_target(config['target'], config.get('file'))
    except BaseException:
        _reply({'error': traceback.format_exc()})
        raise SystemExit(1) from None
    _warm_up()
    _reply({'ready': True})
    for line in iter(sys.stdin.readline, ''):
        command = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _attempt(scenario, config['journal'], command)
        status, timed_out = _wait(pid, float(command['timeout']))
        _reply({'status': status, 'timed_out': timed_out})


if __name__ == '__main__':
    main()
