"""What the console's test modules share: a journal holding one finished execution, and a client of the app on it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from helpers import Calls, two_step_agent
from starlette.testclient import TestClient

from pydantic_ai_durable import execution
from pydantic_ai_durable._console import ConsoleSettings, build_app
from pydantic_ai_durable.journals import DiskJournal

LOCAL = 'http://127.0.0.1:8765'
"""Where the console serves by default: its own origin, for the host and origin checks."""


def record_order(path: Path) -> Path:
    """A disk journal at `path` with `order-1`, the two-step agent's finished execution."""

    async def record() -> None:
        journal = DiskJournal(path)
        async with execution('order-1', journal=journal):
            await two_step_agent(journal, Calls()).run('count the rows')
        await journal.close()

    asyncio.run(record())
    return path


def console_client(path: Path, base: str = LOCAL, **settings: Any) -> TestClient:
    """A client of the console app on the disk journal at `path`, as a browser at `base` would reach it."""
    return TestClient(build_app(DiskJournal(path), ConsoleSettings(**settings)), base_url=base)
