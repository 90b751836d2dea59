"""The CLI in a process of its own, on one journal directory, as an operator runs it from a shell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def cli(journal: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'pydantic_ai_durable', '--journal', str(journal), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
    )
