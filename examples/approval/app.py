"""The approval example's web app: stateless handlers over the journal, with no agent and no history in hand.

    APPROVAL_DATA=/tmp/approval python examples/approval/app.py      # and a worker beside it
    curl -X POST localhost:8000/orders -d '{"order": "A-1", "amount": 25}'
    curl localhost:8000/approvals
    curl -X POST localhost:8000/approvals/refund:A-1/CALL_ID -d '{"approve": true, "by": "alice"}'
    curl localhost:8000/orders/refund:A-1

`POST /orders` sends the durable task `refund` to the worker, whose run ends waiting for a person's
approval. `GET /approvals` lists every call a waiting execution waits on, read from the journal alone.
`POST /approvals/{key}/{call_id}` records the decision with `resolve(..., dispatch=True)`: the one request
that decides the last pending call sends the task on through the fleet this module imported with the
task, and the worker goes on (should this process die before it sends, the worker's sweep sends it).
`GET /orders/{key}` says where it is.
"""

from __future__ import annotations

import os
from typing import Any

from jobs import app as queue
from jobs import journal, result
from pydantic_ai.tools import ToolDenied
from refunds import TASK
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pydantic_ai_durable import DeferredCall, ExecutionBusy, ResolutionRefused, resolve

store = journal()


def _call(key: str, call: DeferredCall) -> dict[str, Any]:
    return {
        'key': key,
        'call_id': call.call_id,
        'tool': call.tool_name,
        'arguments': call.arguments,
        'since': call.since,
        'deadline': call.deadline,
    }


async def create_order(request: Request) -> JSONResponse:
    body = await request.json()
    order = str(body['order'])
    key = queue.delay(TASK, order, order, int(body['amount']))  # the order is the task's id: one refund each
    return JSONResponse({'key': key}, status_code=202)


async def show_order(request: Request) -> JSONResponse:
    key = request.path_params['key']
    info = next((info for info in await store.list_executions() if info.key == key), None)
    if info is None:
        return JSONResponse({'key': key, 'state': 'queued', 'pending': [], 'output': None})
    pending = [_call(key, call) for call in info.pending]
    return JSONResponse({'key': key, 'state': info.state, 'pending': pending, 'output': result(key)})


async def approvals(request: Request) -> JSONResponse:
    waiting = await store.list_executions(state='waiting')
    return JSONResponse([_call(info.key, call) for info in waiting for call in info.pending])


async def decide(request: Request) -> JSONResponse:
    key, call_id = request.path_params['key'], request.path_params['call_id']
    body = await request.json()
    decision: bool | ToolDenied = True if body.get('approve') else ToolDenied(body.get('message') or 'Refused.')
    try:  # dispatch: the request that decides the last pending call sends the task on to a worker
        resolution = await resolve(store, key, approvals={call_id: decision}, by=body.get('by'), dispatch=True)
    except ResolutionRefused as refused:
        return JSONResponse({'error': str(refused)}, status_code=409)
    except ExecutionBusy as busy:
        return JSONResponse({'error': str(busy)}, status_code=503)
    return JSONResponse({'pending': list(resolution.pending), 'dispatched': resolution.dispatched})


app = Starlette(
    routes=[
        Route('/orders', create_order, methods=['POST']),
        Route('/orders/{key}', show_order),
        Route('/approvals', approvals),
        Route('/approvals/{key}/{call_id}', decide, methods=['POST']),
    ]
)

if __name__ == '__main__':
    import uvicorn

    uvicorn.run(app, host='127.0.0.1', port=int(os.environ.get('PORT', '8000')))
