"""What a waiting execution costs while it waits, and how fast 10,000 of them list (WT-1).

A waiting execution may wait for days, so it must hold nothing: no thread, no connection, no lease. Part
one runs real agents whose refund needs approval until `--agents` executions wait, and counts what the
process and the journal hold after 1 and after all of them: threads, leases held in the journal, and on
PostgreSQL the server sessions of this process. Part two lists waiting executions, as a console or a web
handler does: one real waiting execution's steps and record are copied under `--n` keys through the
journal protocol (as an attempt writes them), and `list_executions(state="waiting")` is timed (median of
five), every listed execution with its pending call read from its record.

    python benchmarks/waiting.py                  # disk and PostgreSQL (a throwaway server), 10,000 each
    python benchmarks/waiting.py --n 2000 --no-postgres
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from pydantic_ai_durable import DiskJournal, Durable, Journal, PostgresJournal, execution

HERE = Path(__file__).resolve().parent
HOLDER = 'benchmark-filler'


def build_agent() -> Agent[None, str | DeferredToolRequests]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart('refund', {'amount': 5}, tool_call_id='c1')])

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model, model_name='waiting'),
        name='waiting',
        output_type=[str, DeferredToolRequests],  # type: ignore[arg-type]
        capabilities=[Durable()],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        return f'refunded {amount}'

    return agent


async def wait_once(journal: Journal, agent: Agent[None, str | DeferredToolRequests], key: str) -> None:
    async with execution(key, journal=journal):
        result = await agent.run('refund')
    assert isinstance(result.output, DeferredToolRequests)


async def leases_held(journal: Journal, keys: list[str]) -> int:
    """How many of `keys` someone holds: a lease is free when a new holder takes it at once."""
    held = 0
    for key in keys:
        lease = await journal.acquire_lease(key, 'benchmark-prober', 5)
        if lease.holder != 'benchmark-prober':
            held += 1
        else:
            await journal.release_lease(key, 'benchmark-prober', lease.epoch)
    return held


def sessions(dsn: str | None) -> str:
    if dsn is None:
        return '-'
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pydantic-ai-durable'"
        ).fetchone()
    return str(row[0] if row else 0)


async def costs(name: str, journal: Journal, agents: int, dsn: str | None) -> None:
    agent = build_agent()
    keys = [f'waits-{index}' for index in range(agents)]
    print(f'{name}: what {agents} waiting executions hold')
    print('  | after | threads | leases held | server sessions (pool, any number of executions) |')
    print('  |---|---|---|---|')
    rows = [('none', 0), ('1 waits', 1), (f'{agents} wait', agents)]
    done = 0
    for label, upto in rows:
        while done < upto:
            await wait_once(journal, agent, keys[done])
            done += 1
        held = await leases_held(journal, keys[:done])
        print(f'  | {label} | {threading.active_count()} | {held} | {sessions(dsn)} |')
    waiting = await journal.list_executions(state='waiting')
    print(f'  {len(waiting)} executions waiting, {sum(len(info.pending) for info in waiting)} calls pending')
    await journal.close()
    print(f'  after the journal is closed: {sessions(dsn)} server sessions')


async def fill(journal: Journal, n: int) -> None:
    """`n` copies of one real waiting execution, each written under its own lease as an attempt writes it."""
    await wait_once(journal, build_agent(), 'template')
    record = await journal.read_execution('template')
    snapshot = await journal.read_run('template', '0')
    assert record is not None and record['status'] == 'waiting'
    for index in range(n):
        key = f'waiting-{index:05d}'
        lease = await journal.acquire_lease(key, HOLDER, 60)
        for position, entry in sorted(snapshot.entries.items()):
            await journal.write_entry(key, '0', position, entry, epoch=lease.epoch)
        await journal.write_execution(key, {**record, 'key': key}, epoch=lease.epoch)
        await journal.release_lease(key, HOLDER, lease.epoch)


async def listing(name: str, journal: Journal, n: int) -> None:
    started = time.perf_counter()
    await fill(journal, n)
    print(f'{name}: filled with {n} waiting executions in {time.perf_counter() - started:.1f} s')
    times: list[float] = []
    infos: list[Any] = []
    for _ in range(5):
        started = time.perf_counter()
        infos = await journal.list_executions(state='waiting')
        times.append(time.perf_counter() - started)
    pending = sum(len(info.pending) for info in infos)
    median = statistics.median(times)
    print(
        f'  {len(infos)} waiting executions listed ({pending} pending calls read from their records) in '
        f'{median * 1000:.0f} ms (median of 5; best {min(times) * 1000:.0f} ms): '
        f'{"under" if median < 1.0 else "OVER"} one second'
    )
    await journal.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--n', type=int, default=10_000, help='waiting executions to list')
    parser.add_argument('--agents', type=int, default=100, help='real agents that end waiting, for the costs')
    parser.add_argument('--no-postgres', action='store_true')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        await costs('DiskJournal', DiskJournal(Path(scratch) / 'costs'), args.agents, None)
        await listing('DiskJournal', DiskJournal(Path(scratch) / 'listing'), args.n)
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
        await costs('PostgresJournal', PostgresJournal(dsn, schema='bench_costs'), args.agents, dsn)
        await listing('PostgresJournal', PostgresJournal(dsn, schema='bench_listing'), args.n)
    finally:
        server.stop()


if __name__ == '__main__':
    asyncio.run(main())
