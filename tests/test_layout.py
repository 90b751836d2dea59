"""The package's layout, as docs/architecture.md draws it: imports run one way, and no module grows past a limit.

Read from the sources with `ast` (docs/import_graph.py), so an import under `if TYPE_CHECKING:` counts: a
circle only the type checker sees still means its modules can only be understood together. A new module
must be placed in one of `LAYERS` (and in the picture of docs/architecture.md) before this passes.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _load_graph_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location('import_graph', ROOT / 'docs' / 'import_graph.py')
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


import_graph = _load_graph_script()

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ('the integrations with other engines', frozenset({'celery', 'procrastinate'})),
    ('the fleet core', frozenset({'fleet'})),
    ('entry points', frozenset({'__init__', '__main__', '_cli', '_console', 'testing'})),
    ('the capability', frozenset({'_capability'})),
    ('the steps', frozenset({'_steps'})),
    ('the active run and the execution scope', frozenset({'_active_run', '_execution', '_decisions', '_answers'})),
    (
        'the pydantic-ai side of a run',
        frozenset({'_usage', '_fingerprint', '_tracing', '_masking', '_compat', '_messages'}),
    ),
    ('the journal core', frozenset({'_core'})),
    ('the journal backends', frozenset({'journals'})),
    ('the errors', frozenset({'_errors'})),
    ('the process runtime', frozenset({'_runtime'})),
)
"""Top to bottom: a module imports modules of its own layer or of a layer below it, never above."""

FRAMEWORK = frozenset({'pydantic_ai', 'pydantic', 'pydantic_core'})
NEUTRAL = ('_core', 'journals', '_runtime', '_errors')
"""Framework-neutral: they know positions, names, fingerprints and JSON payloads, and import no pydantic."""
FAST = ('__init__', '__main__', '_cli', 'testing', 'testing._plugin', 'fleet', 'celery', 'procrastinate')
"""Loaded without pydantic-ai, which takes seconds to import: the package itself, the CLI, the pytest plugin,
and the queue adapters, which a worker loads before it can refuse a pool it cannot run on (FL-10)."""

STEP_WRITES = frozenset(
    {'claim', 'record', 'keep', 'fence', 'reject', 'failed', 'reached', 'executing', 'ensure_attempt'}
)
"""What the journal core offers for carrying out a step: `Run.claim`, the `Step` methods that write or gate its
entry, `StepWrites.fence`. Above the core only the step pipeline calls them, so a new kind of step cannot
claim or record a step its own way (docs/architecture.md, "Where a change goes")."""
PIPELINE = '_steps._pipeline'

LINE_LIMIT = 500
OVER_THE_LIMIT: dict[str, str] = {}
"""Modules allowed past `LINE_LIMIT`, each with the reason splitting it would cut one concept in two (none)."""


def _top(name: str) -> str:
    return name.split('.')[0]


def _rank(name: str) -> int:
    for rank, (_, members) in enumerate(LAYERS):
        if _top(name) in members:
            return rank
    raise AssertionError(
        f'module {name} is in no layer: add it to LAYERS in tests/test_layout.py and to docs/architecture.md'
    )


def _edges() -> list[Any]:
    return import_graph.edges()  # type: ignore[no-any-return]


def _within(name: str, roots: Iterable[str]) -> bool:
    return any(name == root or name.startswith(f'{root}.') for root in roots)


def test_no_import_circle_not_even_through_type_checking_imports() -> None:
    circles = import_graph.cycles(import_graph.graph())
    assert not circles, f'import circles (TYPE_CHECKING imports included): {circles}'


def test_the_circle_check_sees_type_checking_and_deferred_imports(tmp_path: Path) -> None:
    (tmp_path / '__init__.py').write_text('"""A package."""\n')
    (tmp_path / 'low.py').write_text(
        '"""Low."""\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import High\n'
    )
    (tmp_path / 'high.py').write_text('"""High."""\nfrom .low import Low\ndef later():\n    from . import side\n')
    (tmp_path / 'side.py').write_text('"""Side."""\nfrom . import high\n')
    deps = import_graph.graph(tmp_path)
    assert deps['low'] == {'high': {'typing'}}
    assert deps['high'] == {'low': {'import'}, 'side': {'deferred'}}
    assert import_graph.cycles(deps) == [['high', 'low', 'side']]


def test_every_module_is_in_a_layer() -> None:
    for name in import_graph.modules():
        _rank(name)


def test_imports_run_one_way_from_the_capability_down_to_the_journal_backends() -> None:
    against = [
        f'{edge.source} ({LAYERS[_rank(edge.source)][0]}) imports {edge.target} ({LAYERS[_rank(edge.target)][0]}), '
        f'line {edge.line}, {edge.how}'
        for edge in _edges()
        if not edge.outside and _rank(edge.target) < _rank(edge.source)
    ]
    assert not against, 'imports against the flow of docs/architecture.md:\n' + '\n'.join(against)


def _door_of(name: str) -> str | None:
    """The package a module belongs to (its `__init__` is the door), or `None` for a module of the root."""
    parts = name.split('.')
    return parts[0] if len(parts) > 1 or name in import_graph.packages() else None


def test_every_package_is_entered_through_its_init_only() -> None:
    """A module outside a package imports the package itself, never one of its modules (`journals.disk` neither)."""
    side_doors = sorted(
        f'{edge.source} imports {edge.target} (line {edge.line}): import it from {_door_of(edge.target)}'
        for edge in _edges()
        if not edge.outside
        and _door_of(edge.target) is not None
        and edge.target != _door_of(edge.target)
        and _door_of(edge.source) != _door_of(edge.target)
    )
    assert not side_doors, 'imports through a side door of a package:\n' + '\n'.join(side_doors)


def test_the_door_check_sees_a_side_door(tmp_path: Path) -> None:
    (tmp_path / '__init__.py').write_text('"""A package."""\n')
    (tmp_path / 'outside.py').write_text('"""Outside."""\nfrom .inner._private import thing\n')
    (tmp_path / 'inner').mkdir()
    (tmp_path / 'inner' / '__init__.py').write_text('"""Inner."""\nfrom ._private import thing\n')
    (tmp_path / 'inner' / '_private.py').write_text('"""Private."""\nthing = 1\n')
    targets = {edge.target for edge in import_graph.edges(tmp_path) if edge.source == 'outside' and not edge.outside}
    assert targets == {'inner._private'}


def test_fl1_fl7_the_engine_integrations_and_the_fleet_core_use_only_the_public_api() -> None:
    """`celery`, `procrastinate` and the fleet core are thin modules over what users import themselves.

    A third adapter (Dramatiq, arq, RQ) written outside the package can do all that these two do.
    """
    public = {'__init__', 'fleet'}
    inside = sorted(
        f'{edge.source} imports {edge.target} (line {edge.line})'
        for edge in _edges()
        if not edge.outside
        and _top(edge.source) in LAYERS[0][1] | LAYERS[1][1]
        and edge.target not in public
        and _top(edge.source) != _top(edge.target)
    )
    assert not inside, 'an integration or the fleet core reaches past the public API:\n' + '\n'.join(inside)


def test_fl7_the_fleet_core_is_the_only_module_both_queue_adapters_import() -> None:
    """What two adapters share lives in the fleet core, not in a module each of them reaches into."""
    imported: dict[str, set[str]] = {'celery': set(), 'procrastinate': set()}
    for edge in _edges():
        if not edge.outside and edge.source in imported and edge.target != '__init__':
            imported[edge.source].add(edge.target)
    assert imported['celery'] & imported['procrastinate'] == {'fleet'}, imported


def test_only_the_entry_points_know_the_capability() -> None:
    knowing = sorted(
        {edge.source for edge in _edges() if edge.target == '_capability' and _top(edge.source) != '_capability'}
    )
    assert set(knowing) <= {'__init__', 'testing._child'}, f'modules that import _capability: {knowing}'


def test_the_journal_core_and_backends_import_no_pydantic() -> None:
    found = [
        f'{edge.source} imports {edge.target} (line {edge.line})'
        for edge in _edges()
        if edge.outside and edge.target in FRAMEWORK and _within(edge.source, NEUTRAL)
    ]
    assert not found, 'the journal core and backends must stay framework-neutral:\n' + '\n'.join(found)


def test_the_package_the_cli_and_the_pytest_plugin_load_without_pydantic_ai() -> None:
    needed: dict[str, set[str]] = {}
    pydantic_ai: set[str] = set()
    for edge in _edges():
        if edge.how == 'typing':
            continue  # never runs
        if edge.outside:
            if edge.target == 'pydantic_ai':
                pydantic_ai.add(edge.source)
        else:
            needed.setdefault(edge.source, set()).add(edge.target)
    for start in FAST:
        path, seen, waiting = {start: [start]}, {start}, [start]
        while waiting:
            current = waiting.pop()
            assert current not in pydantic_ai, f'{start} imports pydantic-ai through {" -> ".join(path[current])}'
            for target in sorted(needed.get(current, ())):
                if target not in seen:
                    seen.add(target)
                    path[target] = [*path[current], target]
                    waiting.append(target)


DISK_STORAGE = 'journals._disk_format'
"""The one module that talks to diskcache and to SQLite: every statement on a disk journal's database (J-10)."""
SQL = re.compile(r'\b(SELECT|INSERT|UPDATE|DELETE|REPLACE|PRAGMA|SAVEPOINT|BEGIN|COMMIT|ROLLBACK|VACUUM)\b')
DISKCACHE_INTERNALS = frozenset({'_con', '_sql', '_sql_retry', '_local', '_disk', '_txn_id', '_transact'})


def test_fl10_the_queue_adapters_import_without_pydantic_ai_at_run_time() -> None:
    """The static check above follows imports; this one runs them, lazy names of the package included."""
    import subprocess
    import sys

    script = (
        'import sys, pydantic_ai_durable.fleet, pydantic_ai_durable.celery, pydantic_ai_durable.procrastinate; '
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'pydantic_ai'))"
    )
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[]'


def test_j10_one_module_imports_diskcache_or_sqlite3_and_holds_every_statement_on_the_disk_database() -> None:
    importing = sorted(
        f'{edge.source} imports {edge.target} (line {edge.line})'
        for edge in _edges()
        if edge.outside and edge.target in ('diskcache', 'sqlite3') and edge.source != DISK_STORAGE
    )
    assert not importing, f'only {DISK_STORAGE} may import diskcache or sqlite3:\n' + '\n'.join(importing)
    for name, path in import_graph.modules().items():
        if name == DISK_STORAGE or not name.startswith(('journals.disk', 'journals._disk_')):
            continue
        tree = ast.parse(path.read_text(encoding='utf-8'))
        statements = [
            f'line {node.lineno}: {node.value[:60]!r}'
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value)
        ]
        assert not statements, f'{name} holds SQL; it belongs in {DISK_STORAGE}:\n' + '\n'.join(statements)
        internals = [
            f'line {node.lineno}: .{node.attr}'
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in DISKCACHE_INTERNALS
        ]
        assert not internals, f'{name} reaches into diskcache; only {DISK_STORAGE} may:\n' + '\n'.join(internals)


def test_no_module_is_over_the_line_limit() -> None:
    sizes = {name: len(path.read_text(encoding='utf-8').splitlines()) for name, path in import_graph.modules().items()}
    over = {name: size for name, size in sizes.items() if size > LINE_LIMIT and name not in OVER_THE_LIMIT}
    assert not over, f'modules over {LINE_LIMIT} lines (split them by concept, see docs/architecture.md): {over}'
    stale = sorted(name for name in OVER_THE_LIMIT if sizes.get(name, 0) <= LINE_LIMIT)
    assert not stale, f'OVER_THE_LIMIT names modules that are no longer over it: {stale}'


def test_every_module_opens_with_a_docstring_that_names_its_seam() -> None:
    missing = [
        name
        for name, path in import_graph.modules().items()
        if not ast.get_docstring(ast.parse(path.read_text(encoding='utf-8')))
    ]
    assert not missing, f'modules without a docstring: {missing}'


def _step_write_calls(root: Path | None = None) -> list[str]:
    """Every call, outside the journal core and the layers below it, of a method named in `STEP_WRITES`."""
    found = []
    for name, path in (import_graph.modules() if root is None else import_graph.modules(root)).items():
        if _within(name, NEUTRAL) or name == PIPELINE:
            continue  # the core defines them; the backends and the runtime sit below it and cannot reach them
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STEP_WRITES:
                found.append(f'{name} line {node.lineno}: .{node.func.attr}()')
    return found


def test_the_step_pipeline_is_the_only_caller_of_the_cores_step_writes() -> None:
    """Every kind of step is claimed, replayed, run and recorded by `_steps/_pipeline.py` alone (#48)."""
    found = _step_write_calls()
    assert not found, (
        f'claims and step writes outside {PIPELINE} (write a StepKind and hand it to run_step instead):\n'
        + '\n'.join(found)
    )


def test_the_step_write_check_sees_a_claim_outside_the_pipeline(tmp_path: Path) -> None:
    (tmp_path / '__init__.py').write_text('"""A package."""\n')
    (tmp_path / '_mine.py').write_text(
        '"""A step of its own."""\nasync def f(active):\n    step = active.run.claim("x", "tool", None)\n'
        '    await step.record(1)\n'
    )
    assert _step_write_calls(tmp_path) == ['_mine line 3: .claim()', '_mine line 4: .record()']
