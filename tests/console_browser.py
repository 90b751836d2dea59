"""A real headless Chromium for the console tests (UI rules): Debian's chromium and chromium-driver, never a download.

One browser serves a whole test module. As root Chromium needs `--no-sandbox`; the other switches keep it
off the network (no updates, no sync, no QUIC) and give it a fresh profile. Without the Debian packages the
tests skip, except in CI (`CI=true`), where they fail, so CI never passes by skipping them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pg import in_ci

CHROMIUM = '/usr/bin/chromium'
CHROMEDRIVER = '/usr/bin/chromedriver'
SCREENSHOTS_VARIABLE = 'PYDANTIC_AI_DURABLE_SCREENSHOTS'
"""A directory to copy the screenshots into (the docs' images: `docs/images/console`)."""


def _unavailable(reason: str) -> None:
    message = f'{reason}: install the Debian packages chromium and chromium-driver (.ci/services.sh does).'
    if in_ci():
        pytest.fail(f'{message} (CI=true: not skipping)', pytrace=False)
    pytest.skip(message)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven through Selenium, closed afterwards."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        _unavailable(f'{CHROMIUM} or {CHROMEDRIVER} is missing')
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix='console-chromium-')
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for switch in (
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--window-size=1360,900',
        f'--user-data-dir={profile}',
    ):
        options.add_argument(switch)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return int(probe.getsockname()[1])


@contextmanager
def console_server(
    journal: str, *extra: str, serving: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> Iterator[str]:
    """`pydantic-ai-durable --journal JOURNAL [EXTRA] serve [SERVING]` in a process of its own; yields its base URL."""
    port = free_port()
    command = [sys.executable, '-m', 'pydantic_ai_durable', '--journal', journal, *extra, 'serve', *serving]
    with serving_process([*command, '--port', str(port)], port, env=env):
        yield f'http://127.0.0.1:{port}'


@contextmanager
def serving_process(
    command: list[str], port: int, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """`command`, a console that listens on 127.0.0.1:`port`, once it answers; terminated afterwards."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, text=True
    )
    base = f'http://127.0.0.1:{port}'
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f'{base}/static/console.css', timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read() if process.stdout else ''
                    raise AssertionError(f'the console did not start: {output}') from None
                time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def screenshot(driver: Any, directory: Path, name: str, *, docs: bool = True, whole: bool = False) -> Path:
    """Save the page as `name.png` in `directory`, and in `$PYDANTIC_AI_DURABLE_SCREENSHOTS` when set (the docs).

    `whole` takes the whole page (up to 2,400 pixels high), not only what the window shows.
    """
    path = directory / f'{name}.png'
    size = driver.get_window_size()
    if whole:
        height = int(driver.execute_script('return document.documentElement.scrollHeight'))
        driver.set_window_size(size['width'], min(max(height + 120, size['height']), 2400))
    try:
        driver.save_screenshot(str(path))
    finally:
        if whole:
            driver.set_window_size(size['width'], size['height'])
    into = os.environ.get(SCREENSHOTS_VARIABLE)
    if into and docs:
        Path(into).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(into) / path.name)
    return path
