"""The approval example's worker: runs refunds from the job queue, and goes on with them once decided.

    APPROVAL_DATA=/tmp/approval python examples/approval/worker.py

Every job runs the same code, the durable task `refund` around `agent.run(prompt)`: the first time the run
ends waiting for the refund's approval, and the job ends with it (`Fleet.run` returns a `Waiting`: nothing
is held while a person decides). Once the web app recorded the decision, it sends the job again
(`dispatch=True`), and the run replays and goes on. Beside its jobs, on the same event loop, the worker
sweeps: an execution whose worker was killed is sent again (its refund is not paid twice: it replays),
as is a decided one that nobody sent, and a refund left undecided past its deadline is denied.
"""

from __future__ import annotations

import asyncio
import logging

from jobs import app, save_result
from refunds import refund_order

from pydantic_ai_durable.fleet import Waiting, sweep_on_this_loop

log = logging.getLogger('approval.worker')


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format='%(process)d %(name)s: %(message)s')
    log.info('worker ready for %s', refund_order.__name__)
    sweep_on_this_loop(app.fleet)  # every `resume_after / 3` seconds, beside the jobs, never as one of them
    while True:
        delivery = app.claim()
        if delivery is None:
            await asyncio.sleep(0.2)
            continue
        outcome = await app.run(delivery)
        if isinstance(outcome, Waiting):
            log.info('%s waits for a decision on %s', outcome.key, ', '.join(outcome.pending))
        elif isinstance(outcome, str):
            save_result(delivery.key, outcome)
            log.info('%s finished: %s', delivery.key, outcome)


if __name__ == '__main__':
    asyncio.run(main())
