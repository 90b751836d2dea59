"""What a journal full of finished executions costs an execution: opening in 10,000 finished ones vs none (FN-2).

Finished executions are kept until their retention ends, and the end of every successful attempt
prunes the expired ones. Neither may make an execution slower as the journal grows: the prune reads an
index of deadlines, and nothing on an execution's path scans the journal. This script fills one journal
with 10,000 finished executions (and, in a third journal, 10,000 whose retention has already ended, of
which each successful attempt deletes at most 8), then times entering and leaving an execution that runs
a two-step agent, interleaved with the same in an empty journal, and prints the medians side by side.

    python benchmarks/retention.py              # disk and PostgreSQL (a throwaway server), 10,000 each
    python benchmarks/retention.py --n 2000     # smaller journals
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import DiskJournal, Durable, Journal, PostgresJournal, execution

HERE = Path(__file__).resolve().parent


def build_agent() -> Agent[None, str]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(part, ToolReturnPart) for message in messages for part in message.parts):
            return ModelResponse(parts=[ToolCallPart('lookup', {'q': 'x'}, tool_call_id='l1')])
        return ModelResponse(parts=[TextPart('done')])

    def lookup(q: str) -> str:
        return 'found'

    return Agent(
        FunctionModel(model, model_name='retention'),
        name='retention',
        toolsets=[FunctionToolset([lookup], id='t')],
        capabilities=[Durable()],
    )


async def fill(journal: Journal, n: int, retention: float) -> None:
    """`n` finished executions, written as an attempt's end writes them (status finished, a retention)."""
    for index in range(n):
        key = f'filled-{index}'
        lease = await journal.acquire_lease(key, 'benchmark-filler', 60)
        record = {'v': 1, 'key': key, 'runs': ['0'], 'status': 'finished', 'attempts': 1, 'retention': retention}
        await journal.write_entry(
            key, '0', 0, {'v': 1, 'name': 'm', 'kind': 'model', 'fingerprint': 'f', 'payload': 1}, epoch=lease.epoch
        )
        await journal.write_execution(key, record, epoch=lease.epoch)
        await journal.release_lease(key, 'benchmark-filler', lease.epoch)


async def one_execution(journal: Journal, agent: Agent[None, str], key: str) -> float:
    started = time.perf_counter()
    async with execution(key, journal=journal):
        await agent.run('go')
    return time.perf_counter() - started


async def compare(name: str, make: Any, n: int, rounds: int) -> None:
    empty, full, expired = make('empty'), make('full'), make('expired')
    agent = build_agent()
    filled = time.perf_counter()
    await fill(full, n, retention=7 * 86400.0)
    await fill(expired, n, retention=0.0)
    print(f'{name}: filled two journals with {n} finished executions each in {time.perf_counter() - filled:.1f} s')
    times: dict[str, list[float]] = {'empty': [], 'full': [], 'expired': []}
    for round_ in range(rounds):  # interleaved, so a busy moment of the machine hits all three alike
        for label, journal in (('empty', empty), ('full', full), ('expired', expired)):
            times[label].append(await one_execution(journal, agent, f'measured-{round_}'))
    base = statistics.median(times['empty'])
    for label, description in (
        ('empty', 'an empty journal'),
        ('full', f'{n} finished executions, none expired'),
        ('expired', f'{n} finished executions, all expired (each attempt prunes 8)'),
    ):
        median = statistics.median(times[label])
        print(f'  {description:<62} {median * 1000:7.2f} ms per execution  {median / base:5.2f}x')
    left = len(await expired.list_executions())
    print(f'  expired journal after {rounds} executions: {left} executions left ({n + rounds - left} pruned)')
    for journal in (empty, full, expired):
        await journal.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--n', type=int, default=10_000)
    parser.add_argument('--rounds', type=int, default=41)
    parser.add_argument('--no-postgres', action='store_true')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        await compare('DiskJournal', lambda label: DiskJournal(Path(scratch) / label), args.n, args.rounds)
    if args.no_postgres:
        return
    sys.path.insert(0, str(HERE.parent / 'tests'))
    import pg

    binaries = pg._find_binaries()
    if binaries is None:
        print('PostgreSQL: not run (no initdb / pg_ctl on this machine)')
        return
    server = pg._Server(binaries)
    dsn = server.start()
    try:
        await compare(
            'PostgresJournal', lambda label: PostgresJournal(dsn, schema=f'bench_{label}'), args.n, args.rounds
        )
    finally:
        server.stop()


if __name__ == '__main__':
    asyncio.run(main())
