"""Running one attempt of a scenario for the harness: in this process, or in a child process killed with SIGKILL.

In process, a crash is a `SimulatedCrash` raised at the chosen step boundary. With `kill=True` a helper
process imports the scenario once and forks one child per attempt, which is killed at the boundary as a
dying process would be; its events reach the harness through a file, all a killed process leaves. Either
way an attempt comes back as the `AttemptRecord` of what it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .._core import StepPoint
from ..journals import DiskJournal, Journal, delete_under_lease
from ._crash import CrashPlan
from ._record import AttemptRecord, Event, Recorder, StepRef, run_recorded

__all__ = ('ForkServer', 'InProcess', 'Scenario', 'forget', 'journal_spec', 'target_of')

Scenario = Callable[[], Awaitable[Any]]
"""An `async def scenario()` that builds and runs the agent and returns its result."""


class InProcess:
    """Runs each attempt in this process; a crash is a `SimulatedCrash` raised at the step boundary."""

    killed = False

    def __init__(self, scenario: Scenario, journal: Journal) -> None:
        self.scenario = scenario
        self.journal = journal

    async def attempt(self, key: str, crash: tuple[StepRef, StepPoint] | None) -> AttemptRecord:
        events: list[Event] = []
        recorder = Recorder(events.append, _plan(crash, kill=False))
        result, error = await run_recorded(self.scenario, journal=self.journal, key=key, recorder=recorder)
        attempt = AttemptRecord.parse(events)
        attempt.result = result
        attempt.exception = error
        return attempt

    async def close(self) -> None:
        return None


def _plan(crash: tuple[StepRef, StepPoint] | None, *, kill: bool) -> CrashPlan | None:
    if crash is None:
        return None
    step, point = crash
    return CrashPlan(position=step.position, name=step.name, run=step.run, point=point, kill=kill)


class ForkServer:
    """Runs each attempt in a child process that is killed with SIGKILL at the crash point.

    One helper process imports the scenario once and forks a fresh process per attempt, so an attempt
    costs a fork instead of a Python start-up and an import of pydantic-ai (seconds each). Every
    attempt's events are appended to a file as they happen, which is all a killed process leaves.
    """

    killed = True

    def __init__(self, process: asyncio.subprocess.Process, directory: Path, timeout: float) -> None:
        self._process = process
        self._directory = directory
        self._timeout = timeout
        self._count = 0

    @classmethod
    async def start(
        cls, target: str, file: str | None, journal: dict[str, Any], directory: Path, timeout: float
    ) -> ForkServer:
        from ._child import ENV

        config = {'target': target, 'file': file, 'sys_path': sys.path, 'journal': journal}
        stderr = (directory / 'server.log').open('wb')
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                '-m',
                'pydantic_ai_durable.testing._child',
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, ENV: json.dumps(config)},
            )
        finally:
            stderr.close()
        server = cls(process, directory, timeout)
        reply = await server._read(timeout=max(timeout, 120.0))
        if not reply.get('ready'):
            await server.close()
            log = (directory / 'server.log').read_text(errors='replace')[-2000:]
            raise RuntimeError(
                f'crash_everywhere(kill=True) could not load {target!r} in a child process:\n'
                f'{reply.get("error", "")}{log}'
            )
        return server

    async def _read(self, *, timeout: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout)
        if not line:
            return {'error': 'the helper process exited'}
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def attempt(self, key: str, crash: tuple[StepRef, StepPoint] | None) -> AttemptRecord:
        self._count += 1
        events = self._directory / f'attempt-{self._count}.events'
        log = self._directory / f'attempt-{self._count}.log'
        target = None
        if crash is not None:
            target = {'run': crash[0].run, 'position': crash[0].position, 'name': crash[0].name, 'point': crash[1]}
        command = {'key': key, 'events': str(events), 'log': str(log), 'crash': target, 'timeout': self._timeout}
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(command) + '\n').encode())
        await self._process.stdin.drain()
        reply = await self._read(timeout=self._timeout + 30.0)
        lines = events.read_text().splitlines() if events.exists() else []
        attempt = AttemptRecord.parse(json.loads(line) for line in lines if line.strip())
        attempt.log = log.read_text(errors='replace')[-2000:] if log.exists() else ''
        status = reply.get('status')
        if reply.get('timed_out'):
            attempt.error = f'the attempt did not finish within {self._timeout} s and was killed'
        elif status == -signal.SIGKILL and attempt.crash is not None:
            attempt.crashed = True
        elif status != 0 and attempt.error is None:
            attempt.error = f'the child process ended with status {status} ({reply.get("error", "")})'
        if attempt.error is not None and attempt.log:
            attempt.error += f'\nchild output:\n{attempt.log}'
        return attempt

    async def close(self) -> None:
        process = self._process
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()


def target_of(scenario: Scenario | str) -> tuple[str, str | None]:
    """`module:function` and the module's file, so a child process can import the scenario."""
    if isinstance(scenario, str):
        return scenario, None
    module = getattr(scenario, '__module__', None)
    qualname = getattr(scenario, '__qualname__', '')
    if not module or module == '__main__' or '<locals>' in qualname:
        raise ValueError(
            'crash_everywhere(kill=True) runs every attempt in a child process that imports the scenario: '
            "pass a module-level async function or an import path such as 'my_tests.agents:scenario', "
            f'not {scenario!r}.'
        )
    return f'{module}:{qualname}', getattr(sys.modules.get(module), '__file__', None)


def journal_spec(journal: Journal | None, journal_factory: str | None, directory: Path) -> dict[str, Any]:
    if journal_factory is not None:
        return {'factory': journal_factory}
    if journal is None:
        return {'disk': str(directory / 'journal'), 'durability': 'process'}
    if isinstance(journal, DiskJournal):
        return {'disk': str(journal.path.absolute()), 'durability': journal.durability}
    raise TypeError(
        f'crash_everywhere(kill=True) needs a journal that other processes can open; {journal!r} cannot be '
        "reopened by a child process. Pass a DiskJournal, journal_factory='module:function' returning the "
        'journal, or no journal (a DiskJournal in a temporary directory).'
    )


async def forget(journal: Journal, key: str) -> None:
    with contextlib.suppress(Exception):  # best effort: a journal that fails here fails the scenario anyway
        await delete_under_lease(journal, key, force=True)
