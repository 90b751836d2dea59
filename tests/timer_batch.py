"""A provider's batch API as a file, and an agent that waits on it (TM): shared by the timer tests and their child.

`FileBatchModel` submits one request as a batch and answers with a suspended response naming the batch; the agent
graph then sleeps `interval` seconds between checks (the model's `continuation_delay`), and each check reads the
batch's status from the file. `ready` in the file (or `ready_after` checks) completes it; `cancel_suspended_response`
marks it `canceled`, after which a check fails as a provider's does. Every submission, check and cancellation is
counted in the file, across processes, and `Sleeps` counts the sleeps of one process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from pydantic_ai_durable import Durable, Journal

HERE = Path(__file__).parent
ANSWER = 'the batch answered'
_REAL_SLEEP = anyio.sleep


@dataclass
class BatchFile:
    """The provider's side: its batches and its counters, in one JSON file."""

    path: Path

    def read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {'submitted': 0, 'checks': 0, 'cancels': 0, 'batches': {}}
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data

    def write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_suffix('.tmp')
        tmp.write_text(json.dumps(data))
        tmp.replace(self.path)

    def count(self, name: str) -> int:
        value: int = self.read()[name]
        return value

    def status(self, batch: str) -> str:
        status: str = self.read()['batches'][batch]
        return status

    def set_all(self, status: str) -> None:
        data = self.read()
        data['batches'] = dict.fromkeys(data['batches'], status)
        self.write(data)


@dataclass
class FileBatchModel(Model):
    """A model whose every request is a batch job the graph polls, its state in `batches` (a provider's double)."""

    batches: BatchFile
    interval: float = 60.0
    ready_after: int | None = None
    """Checks after which a batch is ready by itself; `None`: only when the file says so."""
    held: asyncio.Event | None = None
    """Set: a check announces itself here, then hangs (until its task is cancelled)."""

    def __post_init__(self) -> None:
        super().__init__()

    @property
    def model_name(self) -> str:
        return 'file-batch'

    @property
    def system(self) -> str:
        return 'file-batch'

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        data = self.batches.read()
        last = messages[-1]
        if isinstance(last, ModelResponse) and last.state == 'suspended':
            batch = last.provider_response_id
            assert batch is not None
            if self.held is not None:
                self.held.set()
                await asyncio.Event().wait()  # a check in flight, until the attempt is cancelled
            data['checks'] += 1
            checks = data['checks']
            status = data['batches'][batch]
            if status == 'pending' and self.ready_after is not None and checks >= self.ready_after:
                status = data['batches'][batch] = 'ready'
            self.batches.write(data)
            if status == 'canceled':
                raise ModelHTTPError(400, self.model_name, f'batch {batch} was canceled before the model ran it')
            if status == 'ready':
                return ModelResponse(parts=[TextPart(ANSWER)], model_name=self.model_name, provider_response_id=batch)
            return self._pending(batch)
        data['submitted'] += 1
        batch = f'batch-{data["submitted"]}'
        data['batches'][batch] = 'pending'
        self.batches.write(data)
        return self._pending(batch)

    def _pending(self, batch: str) -> ModelResponse:
        return ModelResponse(parts=[], model_name=self.model_name, provider_response_id=batch, state='suspended')

    def continuation_delay(self, response: ModelResponse) -> float | None:
        return self.interval

    def _limits_polls(self, response: ModelResponse) -> bool:
        return False  # a batch ends by itself (the provider expires it), so its checks are not capped

    async def cancel_suspended_response(self, response: ModelResponse) -> None:
        data = self.batches.read()
        data['cancels'] += 1
        if response.provider_response_id in data['batches']:
            data['batches'][response.provider_response_id] = 'canceled'
        self.batches.write(data)


@dataclass
class Sleeps:
    """Every `anyio.sleep` of a positive length in this process, by length; `real` says whether they wait."""

    real: bool = True
    seconds: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    """What every sleep so far added up to: a clock that moves on by what was slept adds it."""
    on_sleep: Callable[[float], None] | None = None

    def install(self) -> None:
        anyio.sleep = self.sleep  # type: ignore[assignment]

    def uninstall(self) -> None:
        anyio.sleep = _REAL_SLEEP

    async def sleep(self, delay: float, *args: Any, **kwargs: Any) -> None:
        if delay > 0:
            self.seconds.append(delay)
            self.elapsed += delay
            if self.on_sleep is not None:
                self.on_sleep(delay)
        await _REAL_SLEEP(delay if self.real else 0)


def batch_agent(
    journal: Journal,
    batches: BatchFile,
    *,
    interval: float = 60.0,
    suspend_waits_over: float | None = None,
    **kwargs: Any,
) -> Agent[None, str]:
    durable = Durable(journal, suspend_waits_over=suspend_waits_over) if suspend_waits_over else Durable(journal)
    return Agent(
        FileBatchModel(batches, interval=interval, ready_after=kwargs.pop('ready_after', None)),
        name='batched',
        capabilities=[durable],
        **kwargs,
    )


@contextmanager
def counted_sleeps(monkeypatch: pytest.MonkeyPatch | None = None) -> Iterator[Sleeps]:
    """Sleeps that wait no wall time; with `monkeypatch`, on a clock that moves on by what was slept (from 1000 s):
    a timer's clock. Without it the timer reads the wall clock, or the clock a test sets."""
    counted = Sleeps(real=False)
    counted.install()
    try:
        from pydantic_ai_durable._steps import _timer
    except ImportError:  # the package before timers reads no clock
        pass
    else:
        if monkeypatch is not None:
            monkeypatch.setattr(_timer, 'clock', lambda: 1000.0 + counted.elapsed)
    try:
        yield counted
    finally:
        counted.uninstall()


def run_child(
    tmp_path: Path, later: float, kill_at: int = 0, suspend_over: float | None = None
) -> subprocess.CompletedProcess[str]:
    """One attempt in a process of its own (`timer_child.py`), on the journal and the batch file under `tmp_path`."""
    args = [str(tmp_path / 'journal'), str(tmp_path / 'batches.json'), str(tmp_path / 'log'), str(later)]
    extra = [str(kill_at), *([str(suspend_over)] if suspend_over is not None else [])]
    return subprocess.run(
        [sys.executable, str(HERE / 'timer_child.py'), *args, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )


def slept(tmp_path: Path) -> list[float]:
    """The sleeps the child processes logged since the last call, which empties the log."""
    log = tmp_path / 'log'
    seconds = [float(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return seconds
