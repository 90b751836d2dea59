"""Reliability of the journal under real failures (B-2..B-7, T-4).

Real processes, real signals, real file systems: acknowledged writes under SIGKILL, power durability
of `DiskJournal`, leases between processes, values written by another version, broken environments,
hostile keys and hostile tool results. Every scenario drives a real agent (a `FunctionModel` with
function tools) through `execution()`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import diskcache
import pytest
from helpers import Operator, elsewhere
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import (
    DiskJournal,
    Durable,
    Execution,
    ExecutionBusy,
    Journal,
    JournalError,
    JournalUnavailable,
    execution,
)
from pydantic_ai_durable.journals._common import execution_id

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

LOGGER = 'pydantic_ai_durable'
POSIX = pytest.mark.skipif(sys.platform == 'win32', reason='needs POSIX signals')

# -- a small agent whose every live call leaves a trace -------------------------------------------


@dataclass
class Probe:
    """One line per live model call (`model <position>`) and live tool call (`tool <position>`)."""

    calls: list[str] = field(default_factory=list)
    fail_once: set[int] = field(default_factory=set)
    """Tool numbers that raise `RuntimeError` the first time they are called."""

    def positions(self) -> list[int]:
        return [int(line.split()[1]) for line in self.calls]

    def models(self) -> int:
        return sum(line.startswith('model') for line in self.calls)


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]


def step_agent(
    journal: Journal | None,
    probe: Probe,
    *,
    turns: int = 3,
    name: str = 'rel',
    during_tool: Callable[[int], None] | None = None,
) -> Agent[None, str]:
    """`turns` tool calls, then a final answer joining the tool results: positions 0..2*turns."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        probe.calls.append(f'model {2 * len(returns)}')
        if len(returns) < turns:
            n = len(returns) + 1
            return ModelResponse(parts=[ToolCallPart('step', {'n': n}, tool_call_id=f'call-{n}')])
        return ModelResponse(parts=[TextPart(' '.join(str(part.content) for part in returns))])

    def step(n: int) -> str:
        probe.calls.append(f'tool {2 * n - 1}')
        if during_tool is not None:
            during_tool(n)
        if n in probe.fail_once:
            probe.fail_once.discard(n)
            raise RuntimeError(f'tool {n} failed')
        return f'result-{n}'

    return Agent(
        FunctionModel(model, model_name='reliability'),
        name=name,
        toolsets=[FunctionToolset([step], id='steps')],
        capabilities=[Durable(journal)],
    )


EXPECTED = 'result-1 result-2 result-3'


def live_positions(handle: Execution) -> list[int]:
    return [step.position for step in handle.stats.steps if step.outcome == 'live']


def replayed_positions(handle: Execution) -> list[int]:
    return [step.position for step in handle.stats.steps if step.outcome == 'replayed']


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def run_script(tmp_path: Path, name: str, source: str) -> Path:
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    return script


# =================================================================================================
# B-2: acknowledged writes survive SIGKILL; durability="power" really syncs
# =================================================================================================

WRITER = """
    import asyncio, sys
    from pydantic_ai_durable.journals import DiskJournal

    async def main():
        journal = DiskJournal(sys.argv[1], durability=sys.argv[2])
        await journal.open()
        epoch = (await journal.acquire_lease('acked', 'writer', 3600)).epoch
        position = 0
        while True:
            entry = {'v': 1, 'name': 'w', 'kind': 'tool', 'fingerprint': None,
                     'payload': {'i': position, 'pad': 'x' * 2000}}
            if await journal.write_entry('acked', '0', position, entry, epoch=epoch):
                sys.stdout.write(f'{position}\\n')
                sys.stdout.flush()
            position += 1

    asyncio.run(main())
"""


@POSIX
@pytest.mark.parametrize('durability', ['process', 'power'])
async def test_b2_every_acknowledged_write_survives_sigkill(tmp_path: Path, durability: str) -> None:
    script = run_script(tmp_path, 'writer.py', WRITER)
    path = tmp_path / 'journal'
    writer = subprocess.Popen([sys.executable, str(script), str(path), durability], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    acked: list[int] = []
    try:
        while len(acked) < 150:  # kill it while it writes, at whatever point it has reached
            line = writer.stdout.readline()
            assert line, 'the writer died'
            acked.append(int(line))
    finally:
        writer.send_signal(signal.SIGKILL)
        rest = writer.stdout.read()
        writer.wait()
    acked += [int(line) for line in rest.split('\n')[:-1]]  # a last line without newline was never acked
    assert writer.returncode == -signal.SIGKILL

    snapshot = await DiskJournal(path).read_run('acked', '0')
    missing = [position for position in acked if position not in snapshot.entries]
    assert missing == []
    assert all(snapshot.entries[position]['payload']['i'] == position for position in acked)


DB_FILES = {'cache.db', 'cache.db-wal', 'cache.db-shm'}


@pytest.mark.parametrize('durability', ['process', 'power'])
async def test_b2_a_1mb_value_stays_inside_sqlite(tmp_path: Path, durability: str) -> None:
    """diskcache never fsyncs the side files it writes for large values; the journal must not create any."""
    path = tmp_path / 'journal'
    journal = DiskJournal(path, durability=durability)
    await journal.open()
    big = {'v': 1, 'name': 'big', 'kind': 'tool', 'fingerprint': None, 'payload': 'x' * 1_000_000}
    assert await Operator(journal).write_entry('big', '0', 0, big)
    assert await Operator(journal).write_record('big', '0', 'usage', {'v': 1, 'usage': {'pad': 'y' * 1_000_000}})
    found = {str(item.relative_to(path)) for item in path.rglob('*') if item.is_file()}
    assert found <= DB_FILES | {'journal-id'}, found
    assert (await journal.read_run('big', '0')).entries[0]['payload'] == 'x' * 1_000_000
    await journal.close()


def _pragmas(cache: Any) -> tuple[int, str]:
    """`synchronous` and `journal_mode` of the calling thread's own diskcache connection."""
    ((synchronous,),) = cache._con.execute('PRAGMA synchronous').fetchall()
    ((mode,),) = cache._con.execute('PRAGMA journal_mode').fetchall()
    return synchronous, mode


def _pragmas_in_new_thread(cache: Any) -> tuple[int, str]:
    found: list[tuple[int, str]] = []
    thread = threading.Thread(target=lambda: found.append(_pragmas(cache)))
    thread.start()
    thread.join()
    return found[0]


async def test_b2_power_durability_is_wal_with_synchronous_full_on_every_connection(tmp_path: Path) -> None:
    path = tmp_path / 'journal'
    power = DiskJournal(path, durability='power')
    await power.open()
    cache = power._open_cache()
    assert _pragmas(cache) == (2, 'wal')  # FULL: the WAL is fsynced at every commit
    assert _pragmas_in_new_thread(cache) == (2, 'wal')  # e.g. the lease renewer's connection

    # diskcache applies the pragmas of each new connection from its Settings table, which the last
    # opener rewrites: a process-durability journal (or the CLI, another worker) opening the directory
    # must not downgrade the power journal's later connections.
    process = DiskJournal(path, durability='process')
    await process.open()
    with diskcache.Cache(str(path), sqlite_synchronous=0):
        pass
    assert _pragmas_in_new_thread(cache) == (2, 'wal')
    assert _pragmas(cache) == (2, 'wal')
    assert _pragmas_in_new_thread(process._open_cache()) == (1, 'wal')

    # The renewer thread of a real execution writes through a connection of its own.
    probe = Probe()
    async with execution('power', journal=power, lease_ttl=0.3) as handle:
        await asyncio.sleep(0.25)  # at least one renewal
        result = await step_agent(None, probe).run('go')
    assert result.output == EXPECTED
    assert handle.stats.recorded == Counter(model=4, tool=3)
    assert _pragmas_in_new_thread(cache) == (2, 'wal')
    await power.close()
    await process.close()


# =================================================================================================
# B-5: leases between real processes
# =================================================================================================

HOLDER = """
    import asyncio, sys
    from pydantic_ai_durable import DiskJournal, execution

    async def main():
        async with execution(sys.argv[2], journal=DiskJournal(sys.argv[1]), lease_ttl=float(sys.argv[3])):
            print('holding', flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
"""


@pytest.fixture
def start_holder(tmp_path: Path) -> Iterator[Callable[[str, float], subprocess.Popen[str]]]:
    """Start a process that enters `execution(key)` on `tmp_path/journal` and holds it until killed."""
    script = run_script(tmp_path, 'holder.py', HOLDER)
    started: list[subprocess.Popen[str]] = []

    def start(key: str, ttl: float) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / 'journal'), key, str(ttl)], stdout=subprocess.PIPE, text=True
        )
        started.append(process)
        assert process.stdout is not None
        assert process.stdout.readline() == 'holding\n'
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()  # SIGKILL also ends a stopped process
            process.wait()


def _holder_prefix(process: subprocess.Popen[str]) -> str:
    return f'{socket.gethostname()}:{process.pid}:'


@POSIX
async def test_b5_second_process_gets_execution_busy_before_any_model_call(
    tmp_path: Path, start_holder: Callable[[str, float], subprocess.Popen[str]]
) -> None:
    holder = start_holder('busy', 30.0)
    journal = DiskJournal(tmp_path / 'journal')
    probe = Probe()
    agent = step_agent(journal, probe)
    with pytest.raises(ExecutionBusy) as busy:
        async with execution('busy'):
            await agent.run('go')
    assert probe.calls == []  # refused before the first model request
    error = busy.value
    assert error.holder.startswith(_holder_prefix(holder))
    assert time.time() + 25 < error.expires_at < time.time() + 31
    assert error.holder in str(error)
    when = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(int(error.expires_at)))
    assert when in str(error)
    assert (await journal.read_execution('busy') or {}).get('attempts') == 1  # the refused attempt wrote nothing

    with pytest.raises(ExecutionBusy):  # an execution given the journal is refused on entry
        async with execution('busy', journal=journal):
            pass
    assert probe.calls == []


@POSIX
async def test_b5_holder_killed_by_sigkill_is_taken_over_at_once(
    tmp_path: Path, start_holder: Callable[[str, float], subprocess.Popen[str]]
) -> None:
    holder = start_holder('crashed', 30.0)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    journal = DiskJournal(tmp_path / 'journal')
    probe = Probe()
    started = time.monotonic()
    async with execution('crashed', journal=journal) as handle:
        entered = time.monotonic() - started
        result = await step_agent(None, probe).run('go')
    assert entered < 2.0  # no waiting for the 30 s lease of the dead holder
    assert handle.attempt == 2
    assert result.output == EXPECTED


@POSIX
async def test_b5_holder_that_hangs_past_its_expiry_is_taken_over_after_it(
    tmp_path: Path, start_holder: Callable[[str, float], subprocess.Popen[str]]
) -> None:
    holder = start_holder('hung', 2.0)
    holder.send_signal(signal.SIGSTOP)  # alive but frozen: its renewer thread (every ttl/3) cannot renew
    journal = DiskJournal(tmp_path / 'journal')
    probe = Probe()
    agent = step_agent(journal, probe)
    with pytest.raises(ExecutionBusy) as busy:
        async with execution('hung'):
            await agent.run('go')
    assert busy.value.holder.startswith(_holder_prefix(holder))
    assert probe.calls == []
    expires_at = busy.value.expires_at

    took_over_at = None
    while took_over_at is None:
        assert time.time() < expires_at + 3, 'the expired lease was not taken over'
        try:
            async with execution('hung', journal=journal) as handle:  # the lease is taken on entry
                took_over_at = time.time()
                result = await agent.run('go')
        except ExecutionBusy:
            assert probe.calls == []
            await asyncio.sleep(0.05)
    assert expires_at <= took_over_at < expires_at + 2
    assert result.output == EXPECTED
    assert handle.stats.recorded == Counter(model=4, tool=3)
    holder.send_signal(signal.SIGKILL)
    holder.wait()


async def test_b5_lease_is_renewed_while_a_long_step_runs(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / 'journal')

    def slow(seconds: float) -> str:
        time.sleep(seconds)  # a sync tool runs in a worker thread; the lease must not lapse meanwhile
        return 'slept'

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not tool_returns(messages):
            return ModelResponse(parts=[ToolCallPart('slow', {'seconds': 2.5}, tool_call_id='slow-1')])
        return ModelResponse(parts=[TextPart('done')])

    agent = Agent(
        FunctionModel(model, model_name='slow'),
        name='slow',
        toolsets=[FunctionToolset([slow], id='slow')],
        capabilities=[Durable(journal)],
    )

    async def second_attempt() -> tuple[ExecutionBusy, float]:
        await asyncio.sleep(1.8)  # well past the first expiry (1.0 s), inside the 2.5 s tool call
        probed_at = time.time()
        with pytest.raises(ExecutionBusy) as busy:
            async with execution('long', journal=DiskJournal(tmp_path / 'journal')):
                pass
        return busy.value, probed_at

    async with execution('long', journal=journal, lease_ttl=1.0):
        result, (busy, probed_at) = await asyncio.gather(agent.run('go'), elsewhere(second_attempt()))
    assert result.output == 'done'
    assert busy.expires_at > probed_at  # renewed: still live at the probe
    assert busy.holder.startswith(f'{socket.gethostname()}:{os.getpid()}:')


# =================================================================================================
# B-3: values of another version, undecodable or of the wrong shape are a miss with one WARNING
# =================================================================================================


def raw_key(key: str, suffix: str) -> str:
    return f'{execution_id(key)}/{suffix}'


def read_raw(path: Path, key: str, suffix: str) -> Any:
    with diskcache.Cache(str(path)) as cache:
        return json.loads(cache.get(raw_key(key, suffix)))


def put_raw(path: Path, key: str, suffix: str, raw: object) -> None:
    """Replace a stored value behind the journal's back, as another release or a broken disk would."""
    with diskcache.Cache(str(path)) as cache:
        if cache.get(raw_key(key, suffix)) is None:  # not an AssertionError: must not pass for an expected failure
            raise LookupError(f'nothing stored at {suffix}: the disk layout changed, update this test')
        cache.set(raw_key(key, suffix), raw)


Corrupt = Callable[[dict[str, Any]], object]

ENTRY_PROBLEMS: list[tuple[str, int, Corrupt]] = [
    ('unknown-version', 1, lambda value: json.dumps({**value, 'v': 999})),
    ('not-json', 2, lambda value: 'not json {'),
    ('json-of-wrong-shape', 3, lambda value: '[1, 2]'),
    ('not-text', 4, lambda value: {1, 2}),  # diskcache pickles it
    ('not-utf8-bytes', 5, lambda value: b'\xff\xfe{'),
    ('missing-payload', 6, lambda value: json.dumps({k: v for k, v in value.items() if k != 'payload'})),
    ('unknown-kind', 0, lambda value: json.dumps({**value, 'kind': 'weird'})),
    ('fingerprint-not-a-string', 2, lambda value: json.dumps({**value, 'fingerprint': 7})),
]


@pytest.mark.parametrize(('problem', 'position', 'corrupt'), ENTRY_PROBLEMS, ids=[p[0] for p in ENTRY_PROBLEMS])
async def test_b3_unreadable_entry_is_a_miss_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, problem: str, position: int, corrupt: Corrupt
) -> None:
    path = tmp_path / 'journal'
    probe = Probe()
    agent = step_agent(DiskJournal(path), probe)
    async with execution('b3', cleanup='keep'):
        await agent.run('go')
    put_raw(path, 'b3', f'e/0/{position}', corrupt(read_raw(path, 'b3', f'e/0/{position}')))

    probe.calls.clear()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with execution('b3') as handle:
        result = await agent.run('go')
    assert result.output == EXPECTED
    assert live_positions(handle) == [position]  # only the unreadable step runs again
    assert probe.positions() == [position]
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)


META_PROBLEMS = [
    # intact: positions 3 and 5 are tool calls the model asks for again with the recorded arguments (DV-2)
    pytest.param(None, [4, 6], id='intact-meta'),
    pytest.param(
        json.dumps({'v': 999, 'diverge_from': 0, 'high_water': 7, 'model_at_fault': False}),
        [],
        id='unknown-version',
    ),
    pytest.param('not json {', [], id='not-json'),
    pytest.param('[3]', [], id='wrong-shape'),
]


@pytest.mark.parametrize(('raw', 'live'), META_PROBLEMS)
async def test_b3_unreadable_run_meta_is_a_miss_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, raw: str | None, live: list[int]
) -> None:
    path = tmp_path / 'journal'
    journal = DiskJournal(path)
    probe = Probe()
    agent = step_agent(journal, probe)
    async with execution('b3-meta', cleanup='keep'):
        await agent.run('go')
    # The fence a failed attempt leaves (F-6): steps from 3 on must not replay by position.
    assert await Operator(journal).write_record(
        'b3-meta', '0', 'meta', {'v': 1, 'diverge_from': 3, 'high_water': 7, 'model_at_fault': False}
    )
    if raw is not None:
        put_raw(path, 'b3-meta', 'm/0/meta', raw)

    probe.calls.clear()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with execution('b3-meta') as handle:
        result = await agent.run('go')  # never an exception into the run
    assert result.output == EXPECTED
    assert live_positions(handle) == live  # an unreadable meta is a miss: no fence, every entry replays
    assert probe.positions() == live
    # intact: the one divergence at the fence; unreadable: the one warning about the value itself
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)


RECORD_PROBLEMS = [
    pytest.param('x', lambda value: json.dumps({**value, 'v': 999, 'attempts': 41}), id='execution-unknown-version'),
    pytest.param('x', lambda value: 'not json {', id='execution-not-json'),
    pytest.param('x', lambda value: '["runs"]', id='execution-wrong-shape'),
    pytest.param(
        'm/0/usage', lambda value: json.dumps({'v': 999, 'usage': {'requests': 77}}), id='usage-unknown-version'
    ),
    pytest.param('m/0/usage', lambda value: 'not json {', id='usage-not-json'),
    pytest.param('m/0/usage', lambda value: json.dumps({**value, 'usage': 'lots'}), id='usage-wrong-shape'),
]


@pytest.mark.parametrize(('suffix', 'corrupt'), RECORD_PROBLEMS)
async def test_b3_unreadable_execution_or_usage_record_is_a_miss_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, suffix: str, corrupt: Corrupt
) -> None:
    path = tmp_path / 'journal'
    probe = Probe()
    agent = step_agent(DiskJournal(path), probe)
    async with execution('b3-record', cleanup='keep'):
        await agent.run('go')
    put_raw(path, 'b3-record', suffix, corrupt(read_raw(path, 'b3-record', suffix)))

    probe.calls.clear()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with execution('b3-record') as handle:
        result = await agent.run('go')  # never an exception into the run
    assert result.output == EXPECTED
    assert probe.calls == []  # every entry is intact and replays
    assert replayed_positions(handle) == list(range(7))
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)


async def test_b3_unreadable_disk_head_is_a_miss_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / 'journal'
    probe = Probe()
    agent = step_agent(DiskJournal(path), probe)
    async with execution('b3-head', cleanup='keep'):
        await agent.run('go')
    put_raw(path, 'b3-head', 'h', 'not json {')

    probe.calls.clear()
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with execution('b3-head'):
        result = await agent.run('go')
    assert result.output == EXPECTED
    assert len(warnings_of(caplog)) == 1, warnings_of(caplog)


# =================================================================================================
# B-7: bad environments
# =================================================================================================


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[bool]:
    """Mount a tmpfs at `path` (Linux, root); yields whether it is mounted."""
    path.mkdir(parents=True, exist_ok=True)
    if not sys.platform.startswith('linux') or os.geteuid() != 0:
        yield False
        return
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', str(path)], capture_output=True)
    if mounted.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(['umount', '-l', str(path)], capture_output=True)


def fill_file_system(filler: Path) -> None:
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b'\0' * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
        try:
            while True:
                os.write(fd, b'\0' * 512)
        except OSError:
            pass
    finally:
        os.close(fd)


async def assert_unavailable_before_any_model_call(journal: DiskJournal) -> None:
    """Both ways of naming a journal fail before a model is called: on the agent, and on the execution."""
    probe = Probe()
    with pytest.raises(JournalUnavailable):
        async with execution('bad-env'):
            await step_agent(journal, probe).run('go')
    with pytest.raises(JournalUnavailable):
        async with execution('bad-env', journal=journal):
            await step_agent(None, probe).run('go')
    with pytest.raises(JournalUnavailable), execution('bad-env', journal=journal):
        step_agent(None, probe).run_sync('go')
    assert probe.calls == []


async def test_b7_journal_path_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    file = tmp_path / 'not-a-directory'
    file.write_text('x')
    await assert_unavailable_before_any_model_call(DiskJournal(file))
    await assert_unavailable_before_any_model_call(DiskJournal(file / 'below'))
    assert file.read_text() == 'x'


async def test_b7_unwritable_directory_is_unavailable(tmp_path: Path) -> None:
    target = tmp_path / 'read-only'
    with tmpfs(target, 'size=64k,ro') as mounted:
        if not mounted:
            if sys.platform == 'win32' or os.geteuid() == 0:
                pytest.skip('cannot mount a read-only tmpfs, and permissions do not bind root')
            target.chmod(0o500)
        try:
            await assert_unavailable_before_any_model_call(DiskJournal(target))
            await assert_unavailable_before_any_model_call(DiskJournal(target / 'journal'))
        finally:
            if not mounted:
                target.chmod(0o700)


async def test_b7_journal_remounted_read_only_is_unavailable(tmp_path: Path) -> None:
    target = tmp_path / 'remounted'
    with tmpfs(target, 'size=4m') as mounted:
        if not mounted:
            pytest.skip('cannot mount a tmpfs here')
        journal = DiskJournal(target / 'journal')
        async with execution('kept', journal=journal, cleanup='keep'):
            await step_agent(None, Probe()).run('go')
        await journal.close()
        subprocess.run(['mount', '-o', 'remount,ro', str(target)], check=True)
        await assert_unavailable_before_any_model_call(DiskJournal(target / 'journal'))


class FullDiskJournal(DiskJournal):
    """Stand-in for a full disk where tmpfs cannot be mounted: every write fails with ENOSPC once `full`."""

    full = False

    def _fail(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def open(self) -> None:
        self._fail()
        await super().open()

    async def write_entry(self, key: str, run: str, position: int, entry: dict[str, Any], *, epoch: int) -> bool:
        self._fail()
        return await super().write_entry(key, run, position, entry, epoch=epoch)

    async def write_record(self, key: str, run: str, name: str, value: dict[str, Any], *, epoch: int) -> bool:
        self._fail()
        return await super().write_record(key, run, name, value, epoch=epoch)

    async def write_execution(self, key: str, value: dict[str, Any], *, epoch: int) -> bool:
        self._fail()
        return await super().write_execution(key, value, epoch=epoch)


@pytest.fixture
async def filling(tmp_path: Path) -> AsyncIterator[tuple[DiskJournal, Callable[[], None], Callable[[], None]]]:
    """A journal on a small file system, a function that fills it up, and one that frees it again."""
    target = tmp_path / 'small'
    with tmpfs(target, 'size=2m') as mounted:
        if mounted:
            journal = DiskJournal(target / 'journal')
            filler = target / 'filler'
            yield journal, lambda: fill_file_system(filler), filler.unlink
        else:
            fake = journal = FullDiskJournal(target / 'journal')
            yield fake, lambda: setattr(fake, 'full', True), lambda: setattr(fake, 'full', False)
        await journal.close()


async def test_b7_full_file_system_is_unavailable_at_start(
    filling: tuple[DiskJournal, Callable[[], None], Callable[[], None]],
) -> None:
    journal, fill, _ = filling
    fill()
    await assert_unavailable_before_any_model_call(journal)


async def test_jf2_jf3_disk_filling_up_mid_run_stops_the_attempt_and_a_retry_resumes(
    filling: tuple[DiskJournal, Callable[[], None], Callable[[], None]],
) -> None:
    journal, fill, free = filling
    probe = Probe()
    filled: list[int] = []

    def fill_once(n: int) -> None:  # inside step 3 of the first attempt
        if n == 2 and not filled:
            filled.append(n)
            fill()

    agent = step_agent(journal, probe, during_tool=fill_once)
    with pytest.raises(JournalUnavailable) as stopped:
        async with execution('fills-up', cleanup='keep', write_timeout=0.5) as handle:
            await agent.run('go')
    assert 'step 3' in str(stopped.value) and 'full' in str(stopped.value)
    assert probe.positions() == [0, 1, 2, 3]  # no step after the unrecorded one ran
    assert handle.stats.recorded == Counter(model=2, tool=1)

    free()
    assert sorted((await journal.read_run('fills-up', '0')).entries) == [0, 1, 2]  # what was acknowledged
    probe.calls.clear()
    async with execution('fills-up') as retry:  # at once: the lease it left is this process's, ended
        result = await agent.run('go')
    assert result.output == EXPECTED
    assert replayed_positions(retry) == [0, 1, 2]  # every acknowledged step replays, none ran twice
    assert probe.positions() == [3, 4, 5, 6]


# =================================================================================================
# B-4: execution keys never alias, whatever they contain
# =================================================================================================

KEYS = [
    'order/42',
    'Order/42',
    'order/42/e/0/0',  # looks like the disk layout
    'order/42/h',
    'a\x00b',
    'a',
    'a\x00',
    'ключ-🔑-キー-مفتاح',
    'lone-surrogate-\ud800',
    'k' * 10240,
    'etl/load_data',
    'etl_load/data',
    'etl:load_data',
    'etl_load:data',
    'etl_load_data',
]


async def test_b4_keys_with_separators_unicode_and_10kb_never_alias(tmp_path: Path) -> None:
    # Joined with "_", ("etl", "load_data") and ("etl_load", "data") are one string, hence one key:
    # the user must pick a separator that keeps them apart; every distinct string is its own execution.
    assert '_'.join(('etl', 'load_data')) == '_'.join(('etl_load', 'data'))
    journal = DiskJournal(tmp_path / 'journal')
    answers: dict[str, str] = {}
    current: list[str] = []
    calls = Counter[str]()

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls['model'] += 1
        returns = tool_returns(messages)
        if not returns:  # identical requests for every key: only the journal keeps them apart
            return ModelResponse(parts=[ToolCallPart('lookup', {}, tool_call_id='lookup-1')])
        return ModelResponse(parts=[TextPart(str(returns[0].content))])

    def lookup() -> str:
        calls['tool'] += 1
        return answers.get(current[-1], 'WRONG: ran live')

    agent = Agent(
        FunctionModel(model, model_name='keys'),
        name='keys',
        toolsets=[FunctionToolset([lookup], id='keys')],
        capabilities=[Durable(journal)],
    )
    for index, key in enumerate(KEYS):
        answers[key] = f'answer-{index}'
        current.append(key)
        async with execution(key, cleanup='keep'):
            assert (await agent.run('go')).output == f'answer-{index}'
    assert calls == Counter(model=2 * len(KEYS), tool=len(KEYS))
    assert sorted(info.key for info in await journal.list_executions()) == sorted(KEYS)

    answers.clear()  # from now on a live tool call answers WRONG
    for index, key in reversed(list(enumerate(KEYS))):
        current.append(key)
        async with execution(key, cleanup='keep') as handle:
            assert (await agent.run('go')).output == f'answer-{index}', key[:40]
        assert handle.stats.replayed == Counter(model=2, tool=1), key[:40]
        assert handle.stats.recorded == Counter(), key[:40]
    assert calls == Counter(model=2 * len(KEYS), tool=len(KEYS))

    deleted = KEYS[::2]
    for key in deleted:  # a successful execution deletes its own entries, and only those
        current.append(key)
        async with execution(key, cleanup='execution'):
            await agent.run('go')
    kept = [key for key in KEYS if key not in deleted]
    assert sorted(info.key for info in await journal.list_executions()) == sorted(kept)
    for key in kept:
        current.append(key)
        async with execution(key, cleanup='keep') as handle:
            assert (await agent.run('go')).output == f'answer-{KEYS.index(key)}'
        assert handle.stats.replayed == Counter(model=2, tool=1), key[:40]
    assert calls == Counter(model=2 * len(KEYS), tool=len(KEYS))
    await journal.close()


# =================================================================================================
# Hostile tool results: journaled and replayed exactly, or refused with JournalError naming the tool
# =================================================================================================


def nested(depth: int, *, as_dict: bool = False) -> Any:
    value: Any = 'leaf'
    for _ in range(depth):
        value = {'k': value} if as_dict else [value]
    return value


def same(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right):
        return True
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    return bool(type(left) is type(right) and left == right)


HOSTILE: list[Any] = [
    pytest.param('x' * 1_000_000, id='1mb-string'),
    pytest.param(nested(100), id='depth-100-lists'),
    pytest.param(nested(100, as_dict=True), id='depth-100-dicts'),
    pytest.param(nested(500), id='depth-500-lists'),
    pytest.param(nested(500, as_dict=True), id='depth-500-dicts'),
    pytest.param(float('nan'), id='nan'),
    pytest.param([float('inf'), float('-inf'), -0.0, 1e308], id='infinities'),
    pytest.param({'nan': float('nan')}, id='nan-in-dict'),
    pytest.param(b'\xff\xfe\x00 not utf-8', id='non-utf8-bytes'),
    pytest.param(b'valid utf-8 \xc3\xa9', id='utf8-bytes'),
    pytest.param('lone \ud800 surrogate and \x00 nul', id='unencodable-str'),
    pytest.param(10**4000, id='int-4000-digits'),
    pytest.param(10**5000, id='int-5000-digits'),
]

WITNESS_OUTPUT = 'result-1 result-2 result-3'


@pytest.mark.parametrize('value', HOSTILE)
async def test_t4_hostile_tool_result_is_journaled_exactly_or_refused_naming_the_tool(
    tmp_path: Path, value: Any
) -> None:
    journal = DiskJournal(tmp_path / 'journal')
    witness_probe = Probe()
    witness = step_agent(journal, witness_probe, name='witness')
    async with execution('witness', cleanup='keep'):
        assert (await witness.run('go')).output == WITNESS_OUTPUT

    calls = Counter[str]()
    seen: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls['model'] += 1
        returns = tool_returns(messages)
        if not returns:
            return ModelResponse(parts=[ToolCallPart('hostile_tool', {}, tool_call_id='hostile-1')])
        seen.append(returns[0].content)
        return ModelResponse(parts=[TextPart(f'saw a {type(returns[0].content).__name__}')])

    def hostile_tool() -> Any:
        calls['tool'] += 1
        return value

    agent = Agent(
        FunctionModel(model, model_name='hostile'),
        name='hostile',
        toolsets=[FunctionToolset([hostile_tool], id='hostile')],
        capabilities=[Durable(journal)],
    )
    try:
        async with execution('hostile', cleanup='keep') as first:
            live = await agent.run('go')
    except JournalError as exc:  # refused: non-retryable, and it says which tool
        assert 'hostile_tool' in str(exc)
        assert calls['tool'] == 1
    else:
        assert first.stats.not_recorded == []  # journaled
        async with execution('hostile', cleanup='keep') as second:
            replayed = await agent.run('go')
        assert calls == Counter(model=2, tool=1)  # replayed: nothing ran again
        assert second.stats.replayed == Counter(model=2, tool=1)
        assert replayed.output == live.output
        assert len(seen) == 1  # the model saw the live result once; the replay hands back its recorded answer
        (live_return,) = tool_returns(live.all_messages())
        (replayed_return,) = tool_returns(replayed.all_messages())
        assert same(replayed_return.content, live_return.content)
        assert same(live_return.content, seen[0])

    # The journal is intact: the witness replays in full, and a new execution records and cleans up.
    async with execution('witness', cleanup='keep') as handle:
        assert (await witness.run('go')).output == WITNESS_OUTPUT
    assert handle.stats.replayed == Counter(model=4, tool=3)
    fresh_probe = Probe()
    async with execution('after-hostile', cleanup='execution') as handle:
        assert (await step_agent(journal, fresh_probe, name='fresh').run('go')).output == EXPECTED
    assert handle.stats.recorded == Counter(model=4, tool=3)
    assert 'after-hostile' not in {info.key for info in await journal.list_executions()}
    assert len(witness_probe.calls) == 7
    await journal.close()
