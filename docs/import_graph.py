"""Print which module of pydantic_ai_durable imports which, read from the sources with `ast` (nothing runs).

    python docs/import_graph.py                # every module, dependencies first, with its line count
    python docs/import_graph.py --collapse     # one node per package (`_journal`, `journals`, `testing`, ...)
    python docs/import_graph.py --root DIR     # another tree, e.g. one extracted with `git archive`

An import inside `if TYPE_CHECKING:` is a dependency like any other (marked `typing`): a circle that only
the type checker sees still means its modules can only be read together. An import inside a function is
marked `deferred`. Names imported lazily by string (the package `__init__`'s `_LAZY`) are not seen; the
`TYPE_CHECKING` imports beside them name the same modules. tests/test_layout.py guards the layout of
docs/architecture.md with this graph.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = 'pydantic_ai_durable'
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    """A module of the package (`_core._run`, `journals.disk`; the top `__init__` is `__init__`), or the
    top-level name of an outside package (`pydantic_ai`) when `outside`."""
    how: str
    """`import`, `deferred` (inside a function) or `typing` (under `if TYPE_CHECKING:`)."""
    line: int
    outside: bool = False


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under `root`, by its name relative to the package."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob('*.py')):
        parts = path.relative_to(root).with_suffix('').parts
        if parts[-1] == '__init__' and len(parts) > 1:
            parts = parts[:-1]
        found['.'.join(parts)] = path
    return found


def packages(root: Path = ROOT) -> set[str]:
    """The subpackages under `root` (each entered through its `__init__`), by name."""
    return {name for name, path in modules(root).items() if path.name == '__init__.py' and name != '__init__'}


def _package_of(name: str, path: Path) -> list[str]:
    """The package a module's relative imports start from, as name parts (empty: the top package)."""
    parts = [] if name == '__init__' else name.split('.')
    return parts if path.name == '__init__.py' else parts[:-1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING'
    )


def _walk(body: list[ast.stmt], how: str) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, how))
        elif isinstance(node, ast.If) and _is_type_checking(node):
            found += _walk(node.body, 'typing')
            found += _walk(node.orelse, how)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _walk(node.body, 'typing' if how == 'typing' else 'deferred')
        else:  # a class, `try`, `with`, `for`, ... : its blocks are read alike
            for field in ('body', 'orelse', 'finalbody', 'handlers'):
                for item in getattr(node, field, None) or []:
                    found += _walk([item] if isinstance(item, ast.stmt) else item.body, how)
    return found


def edges(root: Path = ROOT) -> list[Edge]:
    """Every import of every module: of another module of the package, or of an outside package."""
    known = modules(root)
    result: list[Edge] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding='utf-8'))
        for node, how in _walk(tree.body, 'import'):
            if isinstance(node, ast.Import):
                targets = [alias.name.split('.') for alias in node.names]
                names: list[str | None] = [None] * len(targets)
            else:
                package = _package_of(name, path)
                module = node.module.split('.') if node.module else []
                absolute = [PACKAGE, *package[: len(package) - node.level + 1], *module] if node.level else module
                targets = [absolute] * len(node.names)
                names = [alias.name for alias in node.names]
            for parts, imported in zip(targets, names, strict=True):
                if parts[:1] != [PACKAGE]:
                    result.append(Edge(name, parts[0], how, node.lineno, outside=True))
                    continue
                inner = parts[1:]
                if imported is not None and '.'.join([*inner, imported]) in known:
                    inner = [*inner, imported]  # `from . import _json` names a module
                result.append(Edge(name, '.'.join(inner) or '__init__', how, node.lineno))
    return result


def graph(root: Path = ROOT, *, collapse: bool = False) -> dict[str, dict[str, set[str]]]:
    """`{module: {imported module: {how, ...}}}` over the package's own modules (every module is a key)."""
    rename = (lambda name: name.split('.')[0]) if collapse else (lambda name: name)
    result: dict[str, dict[str, set[str]]] = {rename(name): {} for name in modules(root)}
    for edge in edges(root):
        source, target = rename(edge.source), rename(edge.target)
        if not edge.outside and source != target:
            result[source].setdefault(target, set()).add(edge.how)
    return result


def cycles(deps: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in deps.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(deps):
        if node not in index:
            visit(node)
    return found


def ordered(deps: dict[str, dict[str, set[str]]]) -> list[str]:
    """The modules with each after everything it imports (where circles allow), ties by name."""
    placed: list[str] = []
    done: set[str] = set()
    waiting = sorted(deps)
    while waiting:
        ready = [node for node in waiting if all(target in done for target in deps[node])] or waiting[:1]
        placed += ready
        done.update(ready)
        waiting = [node for node in waiting if node not in done]
    return placed


def _label(hows: set[str]) -> str:
    """How a dependency is needed at the most: at import (no label), later (`deferred`), or to type (`typing`)."""
    for how, label in (('import', ''), ('deferred', ' (deferred)')):
        if how in hows:
            return label
    return ' (typing)'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--root', type=Path, default=ROOT, help=f'the {PACKAGE} directory to read')
    parser.add_argument('--collapse', action='store_true', help='one node per top-level module or package')
    options = parser.parse_args()
    deps = graph(options.root, collapse=options.collapse)
    sizes: dict[str, int] = {}
    for name, path in modules(options.root).items():
        key = name.split('.')[0] if options.collapse else name
        sizes[key] = sizes.get(key, 0) + len(path.read_text(encoding='utf-8').splitlines())
    for node in ordered(deps):
        targets = ', '.join(target + _label(deps[node][target]) for target in sorted(deps[node]))
        print(f'{node} ({sizes[node]})' + (f' -> {targets}' if targets else ''))
    circles = cycles(deps)
    print('circles: ' + ('; '.join(' <-> '.join(group) for group in circles) if circles else 'none'))


if __name__ == '__main__':
    main()
