"""The approval example's worker: runs refunds from the job queue, and goes on with them once decided.

    APPROVAL_DATA=/tmp/approval python examples/approval/worker.py

Every job runs the same code, `execution(key)` around `agent.run(prompt)`: the first time the run ends
waiting for the refund's approval (the execution is `waiting`, the job is done, nothing is held); once the
web app recorded the decision and enqueued the job again, the run replays and goes on. Between jobs the
worker runs `sweep_interrupted`: an execution whose worker was killed is enqueued again (its refund is not
paid twice: it replays), and a refund left undecided past its deadline is denied.
"""

from __future__ import annotations

import asyncio
import logging

from jobs import claim, enqueue, journal, save_result
from refunds import agent, prompt_for

from pydantic_ai_durable import ExecutionBusy, ExecutionInfo, execution, sweep_interrupted

log = logging.getLogger('approval.worker')


async def run(job: dict[str, object]) -> None:
    key, order, amount = str(job['key']), str(job['order']), int(job['amount'])  # type: ignore[call-overload]
    try:
        async with execution(key, journal=journal(), metadata={'order': order, 'amount': amount}):
            result = await agent.run(prompt_for(order, amount))
    except ExecutionBusy:
        return  # another worker runs it right now
    if isinstance(result.output, str):
        save_result(key, result.output)
        log.info('%s finished: %s', key, result.output)
    else:
        log.info('%s waits for a decision', key)


def dispatch(info: ExecutionInfo) -> None:
    metadata = info.metadata or {}
    enqueue(str(metadata['order']), int(metadata['amount']))


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format='%(process)d %(name)s: %(message)s')
    store = journal()
    while True:
        await sweep_interrupted(store, dispatch, idle=1.0)
        job = claim()
        if job is None:
            await asyncio.sleep(0.2)
            continue
        await run(job)


if __name__ == '__main__':
    asyncio.run(main())
