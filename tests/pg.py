"""A throwaway PostgreSQL server for the tests (B-8: real server, no mocks, no skips in CI).

The server is started once per test session from the PostgreSQL binaries on this machine
(`initdb` / `pg_ctl` on PATH or under `/usr/lib/postgresql/*/bin`), in a temporary directory, on a
free port of 127.0.0.1, with its unix socket in the same directory, and stopped at the end of the
session. As root it runs as the `postgres` user (PostgreSQL refuses to run as root).
`PYDANTIC_AI_DURABLE_PG_DSN` points the tests at an existing server instead.

Without either, tests that need PostgreSQL are skipped with a message saying how to enable them,
except when `CI=true`: then they fail, so CI can never pass by skipping them.

Each test gets its own schema (`fresh_schema()`), so tests never see each other's executions.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

__all__ = [
    'ConnectCounter',
    'crashable_server',
    'drop_schema',
    'fresh_schema',
    'in_ci',
    'pgbouncer_dsn',
    'postgres_dsn',
    'put_raw',
    'server_dsn',
]

DSN_VARIABLE = 'PYDANTIC_AI_DURABLE_PG_DSN'
HOW_TO_ENABLE = (
    'PostgreSQL tests need a server: install the Debian package postgresql (its initdb and pg_ctl are '
    f'used to start a throwaway server), or set {DSN_VARIABLE} to the DSN of a server to use.'
)


def in_ci() -> bool:
    """Whether this is a CI run (`CI=true`), where PostgreSQL tests must run, never skip."""
    return os.environ.get('CI', '').strip().lower() in ('true', '1', 'yes')


def _unavailable(reason: str) -> NoReturn:
    message = f'{reason} {HOW_TO_ENABLE}'
    if in_ci():
        pytest.fail(f'{message} (CI=true: not skipping)', pytrace=False)
    pytest.skip(message)


def _find_binaries() -> Path | None:
    """The directory holding both `initdb` and `pg_ctl`, newest version first."""
    candidates: list[Path] = []
    found = shutil.which('initdb')
    if found:
        candidates.append(Path(os.path.realpath(found)).parent)

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.parent.name
        return tuple(int(part) for part in name.split('.') if part.isdigit())

    installed = sorted(glob.glob('/usr/lib/postgresql/*/bin/initdb'), key=version, reverse=True)
    candidates += [Path(path).parent for path in installed]
    for directory in candidates:
        if (directory / 'initdb').is_file() and (directory / 'pg_ctl').is_file():
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(('127.0.0.1', 0))
        return int(probe.getsockname()[1])


class _Server:
    """One PostgreSQL server in a temporary directory."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.root = Path(tempfile.mkdtemp(prefix='pydantic-ai-durable-pg-'))
        self.data = self.root / 'data'
        self.log = self.root / 'server.log'
        self.port = _free_port()
        self.as_postgres = hasattr(os, 'geteuid') and os.geteuid() == 0
        self.started = False
        self.options = ''
        self.dsn = ''

    def _command(self, *args: str) -> list[str]:
        command = [str(self.binaries / args[0]), *args[1:]]
        return ['runuser', '-u', 'postgres', '--', *command] if self.as_postgres else command

    def _run(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            self._command(*args), capture_output=True, text=True, timeout=timeout, check=False, cwd=self.root
        )
        if result.returncode != 0:
            log = self.log.read_text(errors='replace')[-2000:] if self.log.exists() else ''
            raise RuntimeError(
                f'{" ".join(args[:1])} failed with exit code {result.returncode}: '
                f'{(result.stderr or result.stdout).strip()[-2000:]}\n{log}'
            )

    def start(self, *, crashable: bool = False, max_connections: int = 300) -> str:
        """Start the server; `crashable` keeps every commit safe from `crash()` (a kill of the server's processes)."""
        if self.as_postgres:
            shutil.chown(self.root, 'postgres', 'postgres')
        self._run('initdb', '-D', str(self.data), '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--locale=C', '-N')
        self.options = ' '.join(
            [
                f'-p {self.port}',
                f'-k {self.root}',
                '-c listen_addresses=127.0.0.1',
                f'-c max_connections={max_connections}',
                # The machine itself never crashes in tests: skip the fsyncs. A commit still reaches the
                # kernel before it is acknowledged unless synchronous_commit is off, which only a server
                # that is never killed may have.
                '-c fsync=off',
                f'-c synchronous_commit={"on" if crashable else "off"}',
                '-c full_page_writes=off',
            ]
        )
        self.resume()
        return f'host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=10'

    def resume(self) -> None:
        """Start the server (again) on its data directory."""
        self._run('pg_ctl', '-D', str(self.data), '-l', str(self.log), '-o', self.options, '-w', '-t', '60', 'start')
        self.started = True

    def crash(self) -> None:
        """Stop the server at once, as a crash would (`pg_ctl stop -m immediate`): clients see their connections die."""
        self._run('pg_ctl', '-D', str(self.data), '-m', 'immediate', '-w', 'stop', timeout=60)
        self.started = False

    def stop(self) -> None:
        if self.started:
            with contextlib.suppress(Exception):
                self._run('pg_ctl', '-D', str(self.data), '-m', 'immediate', '-w', 'stop', timeout=60)
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)


_lock = threading.Lock()
_state: dict[str, Any] = {}
"""`dsn` once known; `error` when the server could not be had; `server` when this session started one."""


def _shutdown() -> None:
    dsn = _state.get('dsn')
    schemas: list[str] = _state.pop('schemas', [])
    if dsn and schemas and 'server' not in _state:  # an external server: leave nothing behind
        for schema in schemas:
            with contextlib.suppress(Exception):
                drop_schema(dsn, schema)
    bouncer: _Bouncer | None = _state.pop('bouncer', None)
    if bouncer is not None:
        bouncer.stop()
    server: _Server | None = _state.pop('server', None)
    if server is not None:
        server.stop()


def server_dsn() -> str:
    """The DSN of the session's server, starting it on first use; skips (fails in CI) without one."""
    with _lock:
        if 'dsn' not in _state and 'error' not in _state:
            _state['dsn'] = None
            external = os.environ.get(DSN_VARIABLE, '').strip()
            try:
                import psycopg  # noqa: F401
            except ImportError:
                _state['error'] = "psycopg is not installed (pip install -e '.[postgres]')."
            else:
                if external:
                    _state['dsn'] = external
                else:
                    binaries = _find_binaries()
                    if binaries is None:
                        _state['error'] = 'No PostgreSQL server binaries (initdb, pg_ctl) were found.'
                    else:
                        server = _Server(binaries)
                        atexit.register(_shutdown)
                        try:
                            _state['dsn'] = server.start()
                            _state['server'] = server
                        except Exception as exc:
                            server.stop()
                            _state['failed'] = f'Starting a throwaway PostgreSQL server failed: {exc}'
            if external:
                atexit.register(_shutdown)
        if 'failed' in _state:  # binaries are there but broken: a real failure, never a skip
            pytest.fail(_state['failed'], pytrace=False)
        if 'error' in _state:
            _unavailable(_state['error'])
        dsn: str = _state['dsn']
        return dsn


class _Bouncer:
    """PgBouncer in transaction-pooling mode in front of the session's server, as most fleets run it (CC-8)."""

    def __init__(self, server_dsn: str) -> None:
        from psycopg.conninfo import conninfo_to_dict

        target = conninfo_to_dict(server_dsn)
        self.root = Path(tempfile.mkdtemp(prefix='pydantic-ai-durable-pgbouncer-'))
        self.port = _free_port()
        self.as_postgres = hasattr(os, 'geteuid') and os.geteuid() == 0
        (self.root / 'users.txt').write_text('"postgres" ""\n')
        (self.root / 'pgbouncer.ini').write_text(
            textwrap.dedent(
                f"""
                [databases]
                postgres = host={target['host']} port={target['port']} dbname=postgres user=postgres
                * = host={target['host']} port={target['port']} user=postgres

                [pgbouncer]
                listen_addr = 127.0.0.1
                listen_port = {self.port}
                unix_socket_dir =
                auth_type = trust
                auth_file = {self.root / 'users.txt'}
                pool_mode = transaction
                max_client_conn = 2000
                default_pool_size = 20
                logfile = {self.root / 'pgbouncer.log'}
                pidfile = {self.root / 'pgbouncer.pid'}
                """
            )
        )
        if self.as_postgres:
            shutil.chown(self.root, 'postgres', 'postgres')
            for path in self.root.iterdir():
                shutil.chown(path, 'postgres', 'postgres')
        self.process: subprocess.Popen[bytes] | None = None
        self.dsn = f'host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=10'

    def start(self) -> None:
        binary = shutil.which('pgbouncer') or '/usr/sbin/pgbouncer'
        command = [binary, str(self.root / 'pgbouncer.ini')]
        if self.as_postgres:
            command = ['runuser', '-u', 'postgres', '--', *command]
        self.process = subprocess.Popen(command, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        import psycopg

        for _ in range(100):
            if self.process.poll() is not None:
                error = (self.process.stderr.read() if self.process.stderr else b'').decode(errors='replace')
                raise RuntimeError(f'pgbouncer exited with code {self.process.returncode}: {error[-2000:]}')
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute('SELECT 1')
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError(f'pgbouncer did not accept connections on port {self.port}')

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            if self.process.poll() is None:
                self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def pgbouncer_dsn() -> str:
    """The DSN of a PgBouncer (transaction pooling) in front of the session's server, started on first use.

    Skips without the `pgbouncer` binary (Debian package `pgbouncer`), and fails instead when `CI=true`.
    """
    dsn = server_dsn()
    with _lock:
        bouncer: _Bouncer | None = _state.get('bouncer')
        if bouncer is None:
            if shutil.which('pgbouncer') is None and not Path('/usr/sbin/pgbouncer').exists():
                _unavailable('No pgbouncer binary was found (Debian package pgbouncer).')
            bouncer = _Bouncer(dsn)
            try:
                bouncer.start()
            except Exception as exc:
                bouncer.stop()
                pytest.fail(f'Starting PgBouncer failed: {exc}', pytrace=False)
            _state['bouncer'] = bouncer
            atexit.register(bouncer.stop)
        return bouncer.dsn


def fresh_schema() -> tuple[str, str]:
    """`(dsn, schema)`: a schema name no other test uses (created by the journal on first use)."""
    dsn = server_dsn()
    schema = f'pad_test_{uuid.uuid4().hex[:16]}'
    with _lock:
        _state.setdefault('schemas', []).append(schema)
    return dsn, schema


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL('DROP SCHEMA IF EXISTS {} CASCADE').format(sql.Identifier(schema)))


def put_raw(dsn: str, schema: str, where: tuple[Any, ...], raw: object) -> None:
    """Overwrite the stored text of an existing value, bypassing the journal's encoder (J-3 tests).

    `where` is `('entry', key, run, position)`, `('record', key, run, name)` or `('execution', key)`.
    """
    import psycopg
    from psycopg import sql

    from pydantic_ai_durable.journals._common import execution_id

    eid = execution_id(where[1])
    schema_id = sql.Identifier(schema)
    if where[0] == 'entry':
        query = sql.SQL('UPDATE {}.entries SET value = %s WHERE eid = %s AND run = %s AND position = %s')
        params: tuple[Any, ...] = (raw, eid, where[2], where[3])
    elif where[0] == 'record':
        query = sql.SQL('UPDATE {}.run_records SET value = %s WHERE eid = %s AND run = %s AND name = %s')
        params = (raw, eid, where[2], where[3])
    else:
        query = sql.SQL('UPDATE {}.executions SET record = %s WHERE eid = %s')
        params = (raw, eid)
    with psycopg.connect(dsn, autocommit=True) as conn:
        updated = conn.execute(query.format(schema_id), params).rowcount
    assert updated == 1, f'nothing stored at {where!r}'


@pytest.fixture(scope='session')
def postgres_dsn() -> Iterator[str]:
    """The DSN of a real PostgreSQL server for this session (skipped, or failed in CI, without one)."""
    yield server_dsn()
    _shutdown()


@contextlib.contextmanager
def crashable_server() -> Iterator[_Server]:
    """A PostgreSQL server of the test's own, to crash and restart (JF-rules); skips (fails in CI) without binaries."""
    binaries = _find_binaries()
    if binaries is None:
        _unavailable('No PostgreSQL server binaries (initdb, pg_ctl) were found.')
    server = _Server(binaries)
    try:
        server.dsn = server.start(crashable=True)
        yield server
    finally:
        server.stop()


class ConnectCounter:
    """Counts the connections a `PostgresJournal` opens (by wrapping its `_connect`)."""

    def __init__(self, journal: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real_connect = journal._connect

        async def counting_connect() -> Any:
            self.count += 1
            return await real_connect()

        monkeypatch.setattr(journal, '_connect', counting_connect)
