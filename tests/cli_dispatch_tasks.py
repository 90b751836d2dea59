"""An app's module of durable tasks, as `pydantic-ai-durable approve --dispatch cli_dispatch_tasks` imports it (WT-4).

A queue adapter of its own over the fleet core (`engine` `cli-toy`): sending a task appends it, as a JSON
line, to the file `CLI_DISPATCH_SENT` names. The journal is the disk journal at `CLI_DISPATCH_JOURNAL`.
"""

from __future__ import annotations

import json
import os

from pydantic_ai_durable import DiskJournal
from pydantic_ai_durable.fleet import Delivery, Fleet, fleet_of

ENGINE = 'cli-toy'


class App:
    """The app whose fleet it is."""


def send(delivery: Delivery) -> None:
    with open(os.environ['CLI_DISPATCH_SENT'], 'a') as sent:
        sent.write(json.dumps([delivery.task, delivery.id, list(delivery.args)]) + '\n')


app = App()
fleet = fleet_of(app, ENGINE, lambda: Fleet(ENGINE, send))
fleet.add('pay_out', journal=DiskJournal(os.environ.get('CLI_DISPATCH_JOURNAL', '.durable')))
