"""The README, the pages under docs/ and docs/rules.md tell the truth about this repository, and need
nothing outside it.

- The distribution: its name is not the one another project holds on the package index, the extras
  name the package by its own name, every `pip install` line in the docs names this package (or a
  path), and `__version__` is the installed distribution's.
- Rule ids: every id cited in the README, the docs pages, the CHANGELOG, docs/rules.md, the package,
  the tests (their text and their names: `test_m5_...` cites M-5, `test_u2_1_...` cites U2-1,
  `test_dv2_jf5_h7_...` cites DV-2, JF-5 and H-7), the benchmarks and the examples is defined in
  docs/rules.md, each definition gives its reason, and nothing points to a specification kept elsewhere.
- The public API: every name of the public modules' `__all__`s, every parameter of every public callable,
  every method of the `Journal` protocol and every command and option of the CLI appears in the README or
  in a page under docs/ (the reference lives there).
- The docs' code: every ```python block of the README and of every page runs as written (see
  `test_python_block_runs`).
- The layout: the README is a guide of at most `README_LINES` lines, every page under docs/ is in
  mkdocs.yml's nav, and the README's links into docs/ reach a page and a heading that exist.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from helpers import harness_mismatch

import pydantic_ai_durable
import pydantic_ai_durable.celery
import pydantic_ai_durable.fleet
import pydantic_ai_durable.journals
import pydantic_ai_durable.procrastinate
import pydantic_ai_durable.testing
from pydantic_ai_durable._cli._parsing import build_parser as _build_parser
from pydantic_ai_durable.journals import Journal

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / 'README.md'
DOCS = ROOT / 'docs'
RULES = DOCS / 'rules.md'
MKDOCS = ROOT / 'mkdocs.yml'


def docs_pages() -> list[Path]:
    """Every page of the docs site: the Markdown files under docs/ (rules.md and architecture.md included)."""
    return sorted(DOCS.rglob('*.md'))


def documented_pages() -> list[Path]:
    """Where the public API is described and the code is shown: the README, then every page under docs/."""
    return [README, *docs_pages()]


def _text_files() -> Iterator[Path]:
    """Every file whose rule ids count: the docs, the package, the tests, the benchmarks, the examples."""
    yield README
    yield ROOT / 'CHANGELOG.md'
    yield RULES
    yield from (page for page in docs_pages() if page != RULES)
    for folder, patterns in (
        ('pydantic_ai_durable', ('*.py',)),
        ('tests', ('*.py',)),
        ('benchmarks', ('*.py', '*.md')),
        ('examples', ('*.py', '*.md')),
    ):
        for pattern in patterns:
            yield from sorted((ROOT / folder).rglob(pattern))


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the distribution ------------------------------------------------------------------------------

TAKEN = 'pydantic-ai-durable'
"""On the package index this name belongs to an unrelated project (0.1.0, needs aiosqlite), which also
installs a module `pydantic_ai_durable`: installing that name never installs this package."""


def _canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    return project


def _requirement_name(requirement: str) -> str:
    match = re.match(r'[A-Za-z0-9][A-Za-z0-9._-]*', requirement.strip())
    assert match is not None, requirement
    return _canonical(match[0])


def test_the_distribution_is_not_named_as_the_other_project_on_the_index() -> None:
    assert _canonical(_project()['name']) != TAKEN


def test_the_extras_name_the_package_by_its_own_name() -> None:
    """`test` pulls in `[postgres]` and `dev` pulls in `[test]` through the package's own name."""
    name = _canonical(_project()['name'])
    own = [
        requirement
        for requirements in _project()['optional-dependencies'].values()
        for requirement in requirements
        if _requirement_name(requirement).startswith(TAKEN)
    ]
    assert own, 'the extras no longer refer to the package itself'
    assert [r for r in own if _requirement_name(r) != name] == []


def test_the_installed_distribution_is_this_package() -> None:
    name = _project()['name']
    distribution = metadata.distribution(name)
    assert pydantic_ai_durable.__version__ == _project()['version'] == distribution.version, (
        'pyproject.toml, pydantic_ai_durable.__version__ and the installed metadata disagree: '
        "update them together and reinstall (pip install -e '.[dev]')"
    )
    scripts = {entry.name: entry.value for entry in distribution.entry_points if entry.group == 'console_scripts'}
    assert scripts == {'pydantic-ai-durable': 'pydantic_ai_durable._cli:main'}


_PIP_INSTALL = re.compile(r'pip3? install\b([^`\n]*)')


def _installed_names(command: str) -> Iterator[str]:
    """The distribution names a `pip install` command's arguments name; paths and options are skipped."""
    words = iter(command.split())
    for word in words:
        if word in ('-r', '--requirement', '-c', '--constraint', '--index-url', '-i'):
            next(words, None)
            continue
        word = word.strip('\'"')
        if not word or word.startswith(('-', '.', '/', '~', '#', '&', '|', ';')) or word in ('&&', '||'):
            if word.startswith('#'):
                return  # a comment: the rest of the line is prose
            continue
        if re.match(r'[A-Za-z0-9]', word):
            yield _requirement_name(word)


def test_every_install_line_names_this_package_or_a_path() -> None:
    name = _canonical(_project()['name'])
    wrong: list[str] = []
    for path in _text_files():
        for line_number, line in enumerate(path.read_text().splitlines(), 1):
            for command in _PIP_INSTALL.findall(line):
                for installed in _installed_names(command):
                    if installed.startswith(TAKEN) and installed != name:
                        wrong.append(f'{_where(path)}:{line_number}: pip install{command}')
    assert wrong == [], f'these install another project, {TAKEN!r} on the package index:\n' + '\n'.join(wrong)


def test_the_install_line_check_catches_the_other_project() -> None:
    assert list(_installed_names(" -q -e '.[test]' pytest pytest-asyncio")) == ['pytest', 'pytest-asyncio']
    assert list(_installed_names(" 'pydantic-ai-durable[postgres]'")) == [TAKEN]
    assert list(_installed_names(' -e .  # then pydantic-ai-durable')) == []


# -- rule ids --------------------------------------------------------------------------------------

RULE_ID = re.compile(r'(?<![\w-])([A-Z]+\d*-\d+)(?!\w)')
"""A rule id in text: capitals, maybe digits (U2, PERF), a dash, a number: M-5, U2-1, PERF-2, CLI-1."""

NOT_RULES = {
    'UTF-8': 'the text encoding',
    'ISO-8601': 'the format of dates and times the CLI prints',
    'SHA-256': 'the hash function (rule ids are capitals, so the usual `sha-256` never matches)',
}
"""Strings that look like rule ids and are not."""

RULE_FAMILY = re.compile(r'(?<![\w-])([A-Z]+\d*)-rules\b')
"""A family of rules cited as a whole: "the F-rules"."""

_TEST_NAME = re.compile(r'\bdef (test_\w+)')
_NAME_TOKEN = re.compile(r'([a-z]+)(\d+)(?:_(\d+))?_')

DEFINITION = re.compile(r'([A-Z]+\d*-\d+) ')
"""docs/rules.md defines a rule in a paragraph that starts with its id and a space."""


def rule_ids_of_test_name(name: str) -> list[str]:
    """The ids a test name cites: `test_m3_...` M-3, `test_u2_1_...` U2-1, `test_b9_b10_...` B-9 and B-10."""
    rest, ids = name.removeprefix('test_'), []
    while (token := _NAME_TOKEN.match(rest)) is not None:
        letters, number, sub = token.groups()
        ids.append(f'{letters.upper()}{number}-{sub}' if sub else f'{letters.upper()}-{number}')
        rest = rest[token.end() :]
    return ids


def cited_rule_ids() -> dict[str, set[str]]:
    """Every rule id cited anywhere that counts, with where."""
    cited: dict[str, set[str]] = defaultdict(set)
    for path in _text_files():
        text = path.read_text()
        for line_number, line in enumerate(text.splitlines(), 1):
            for rule in RULE_ID.findall(line):
                cited[rule].add(f'{_where(path)}:{line_number}')
        if path.suffix == '.py':
            for name in _TEST_NAME.findall(text):
                for rule in rule_ids_of_test_name(name):
                    cited[rule].add(f'{_where(path)}: {name}')
    return cited


def rule_definitions(text: str | None = None) -> dict[str, str]:
    """The paragraphs of docs/rules.md that define a rule, by id; a second definition of an id fails."""
    text = RULES.read_text() if text is None else text
    definitions: dict[str, str] = {}
    for paragraph in re.split(r'\n\s*\n', text):
        match = DEFINITION.match(paragraph)
        if match is None:
            continue
        assert match[1] not in definitions, f'docs/rules.md defines {match[1]} twice'
        definitions[match[1]] = paragraph
    return definitions


def undefined_rule_ids(cited: dict[str, set[str]], defined: dict[str, str]) -> dict[str, set[str]]:
    return {rule: where for rule, where in cited.items() if rule not in defined and rule not in NOT_RULES}


def test_rule_ids_are_found_in_text_and_in_test_names() -> None:
    assert RULE_ID.findall('see M-5, U2-1 and PERF-2; B-9..B-14; not UTF-8x or e-3 or x-M-5') == [
        'M-5',
        'U2-1',
        'PERF-2',
        'B-9',
        'B-14',
    ]
    assert rule_ids_of_test_name('test_m5_unfingerprinted_step') == ['M-5']
    assert rule_ids_of_test_name('test_u2_1_spend_is_kept') == ['U2-1']
    assert rule_ids_of_test_name('test_u2_subtracts_usage') == ['U-2']
    assert rule_ids_of_test_name('test_dv2_jf5_h7_a_fence') == ['DV-2', 'JF-5', 'H-7']
    assert rule_ids_of_test_name('test_cli1_list') == ['CLI-1']
    assert rule_ids_of_test_name('test_sigkill_inside_a_tool') == []


def test_every_cited_rule_id_is_defined_in_docs_rules_md() -> None:
    undefined = undefined_rule_ids(cited_rule_ids(), rule_definitions())
    listing = '\n'.join(
        f'  {rule}: cited at {", ".join(sorted(where)[:3])}' for rule, where in sorted(undefined.items())
    )
    assert not undefined, (
        f'{len(undefined)} rule ids are cited but not defined in docs/rules.md (a paragraph starting with the id); '
        f'define them, or if one is not a rule, add it to NOT_RULES with the reason:\n{listing}'
    )


def test_the_undefined_id_check_fails_on_an_undefined_id() -> None:
    defined = rule_definitions('M-5 A rule.\nWhy: a reason.\n\nM-6 Another.\nWhy: another.')
    assert set(defined) == {'M-5', 'M-6'}
    cited = {'M-5': {'a'}, 'M-7': {'b'}, 'UTF-8': {'c'}}
    assert undefined_rule_ids(cited, defined) == {'M-7': {'b'}}


def test_every_rule_definition_gives_its_reason() -> None:
    definitions = rule_definitions()
    assert len(definitions) > 150
    assert [rule for rule, paragraph in definitions.items() if '\nWhy: ' not in paragraph] == []


def test_every_cited_family_of_rules_exists() -> None:
    prefixes = {rule.rsplit('-', 1)[0] for rule in rule_definitions()}
    missing = [
        f'{_where(path)}: {family}-rules'
        for path in _text_files()
        for family in RULE_FAMILY.findall(path.read_text())
        if family not in prefixes
    ]
    assert missing == []


def test_nothing_points_to_a_specification_outside_the_repository() -> None:
    """docs/rules.md is the rulebook; no file may send a reader to a document this repository lacks."""
    outside = re.compile(r'\bSPEC(?:\.md)?\b|SCENARIOS\.md|/work/shared')
    found = [
        f'{_where(path)}:{number}: {line.strip()}'
        for path in _text_files()
        if path != Path(__file__).resolve()  # the pattern above is the one mention allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert found == []


# -- the public API is documented ------------------------------------------------------------------

_FENCE = re.compile(r'^```[^\n]*\n(.*?)^```', re.M | re.S)


def docs_code(text: str | None = None) -> list[str]:
    """Every code block and inline code span of the README and the docs pages (a span may wrap over lines)."""
    if text is None:
        return [piece for page in documented_pages() for piece in docs_code(page.read_text())]
    blocks = _FENCE.findall(text)
    prose = _FENCE.sub('', text)
    return blocks + re.findall(r'`([^`]+)`', prose)


def _arguments(code: str, callee: str) -> set[str]:
    """Names of the arguments written in every `callee(...)` in `code`: `a` in `f(a, *, b=1)`, and `b`."""
    names: set[str] = set()
    for match in re.finditer(rf'(?<![\w]){re.escape(callee)}\(', code):
        depth, start, parts = 1, match.end(), []
        index = start
        while index < len(code) and depth:
            char = code[index]
            if char in '([{':
                depth += 1
            elif char in ')]}':
                depth -= 1
            elif char == ',' and depth == 1:
                parts.append(code[start:index])
                start = index + 1
            index += 1
        parts.append(code[start : index - 1])
        for part in parts:
            word = re.match(r'\s*\*{0,2}([A-Za-z_]\w*)\s*(?:=|$)', part)
            if word is not None:
                names.add(word[1])
    return names


def documented_arguments(callee: str, code: list[str] | None = None) -> set[str]:
    return set().union(*(_arguments(piece, callee) for piece in (docs_code() if code is None else code)))


def _mentioned(name: str, code: list[str]) -> bool:
    return any(re.search(rf'(?<![\w]){re.escape(name)}(?!\w)', piece) for piece in code)


def _called(name: str, code: list[str]) -> bool:
    return any(re.search(rf'(?<![\w]){re.escape(name)}\(', piece) for piece in code)


PUBLIC_MODULES = (
    pydantic_ai_durable,
    pydantic_ai_durable.journals,
    pydantic_ai_durable.testing,
    pydantic_ai_durable.celery,
    pydantic_ai_durable.procrastinate,
    pydantic_ai_durable.fleet,
)

NO_SIGNATURE_TO_DOCUMENT = {
    'Execution': 'made by execution() from an internal object; its attributes are checked instead',
    'Journal': 'a Protocol: its methods are checked one by one',
}


def _public_names() -> list[tuple[str, str, Any]]:
    return [(module.__name__, name, getattr(module, name)) for module in PUBLIC_MODULES for name in module.__all__]


def _parameters(obj: Any) -> list[str] | None:
    """The parameters a user passes, or `None` when `obj` has no signature of its own (an exception, an alias)."""
    if not callable(obj):
        return None
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None  # Exception's own signature (DurableError, SimulatedCrash, ...): a message only
    return [
        name
        for name, parameter in signature.parameters.items()
        if not name.startswith('_') and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]


def undocumented_parameters(code: list[str]) -> list[str]:
    missing = []
    for module, name, obj in _public_names():
        if name in NO_SIGNATURE_TO_DOCUMENT:
            continue
        parameters = _parameters(obj)
        if parameters:
            absent = sorted(set(parameters) - documented_arguments(name, code))
            missing.extend(f'{module}.{name}({parameter}=...)' for parameter in absent)
    for method in _journal_methods():
        parameters = [p for p in _parameters(getattr(Journal, method)) or [] if p != 'self']
        absent = sorted(set(parameters) - documented_arguments(method, code))
        missing.extend(f'Journal.{method}({parameter}=...)' for parameter in absent)
    return missing


def _journal_methods() -> list[str]:
    return sorted(name for name, value in vars(Journal).items() if not name.startswith('_') and callable(value))


def test_every_public_name_is_documented() -> None:
    code = docs_code()
    missing = [f'{module}.{name}' for module, name, _ in _public_names() if not _mentioned(name, code)]
    missing += [f'Journal.{method}' for method in _journal_methods() if not _called(method, code)]
    missing += [f'Execution.{attribute}' for attribute in _execution_attributes() if f'.{attribute}' not in str(code)]
    assert missing == [], 'not in any code span of the README or docs/: ' + ', '.join(missing)


def _execution_attributes() -> list[str]:
    return sorted(name for name, value in vars(pydantic_ai_durable.Execution).items() if isinstance(value, property))


def test_every_parameter_of_a_public_callable_is_documented() -> None:
    assert undocumented_parameters(docs_code()) == []


def test_the_parameter_check_fails_on_a_parameter_the_docs_leave_out() -> None:
    code = docs_code()
    without = [piece.replace('connect_timeout', 'connect_wait') for piece in code]
    assert 'pydantic_ai_durable.PostgresJournal(connect_timeout=...)' in undocumented_parameters(without)
    assert documented_arguments('f', ['f(a, *, b=1)', 'x.f(c="d")', 'f("e", g(h=1))']) == {'a', 'b', 'c'}


def _cli_block() -> str:
    blocks = [
        block
        for page in documented_pages()
        for block in _FENCE.findall(page.read_text())
        if block.startswith('pydantic-ai-durable [')
    ]
    assert len(blocks) == 1, 'the docs show the CLI usage in one block that starts with "pydantic-ai-durable ["'
    return blocks[0]


def _cli_surface(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """The commands and the option strings of the CLI (help aside)."""
    commands: set[str] = set()
    options: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands.add(name)
                options |= _cli_surface(sub)[1]
        else:
            options |= {option for option in action.option_strings if option not in ('-h', '--help')}
    return commands, options


def test_every_command_and_option_of_the_cli_is_documented() -> None:
    commands, options = _cli_surface(_build_parser('pydantic-ai-durable'))
    assert commands == {
        'list',
        'show',
        'delete',
        'prune',
        'rekey',
        'export',
        'import',
        'fork',
        'approve',
        'deny',
        'complete',
        'resolve-event',
        'fail-event',
        'cancel',
        'serve',
    }
    block = _cli_block()
    assert [c for c in sorted(commands) if not re.search(rf'^\s+{c}\b', block, re.M)] == []
    assert [o for o in sorted(options) if not re.search(rf'{re.escape(o)}(?![\w-])', block)] == []


# -- every code block of the docs runs -------------------------------------------------------------

_PYTHON_FENCE = re.compile(r'^```python\n(.*?)^```', re.M | re.S)


def python_blocks(page: Path | None = None) -> list[tuple[str, int, str]]:
    """`(page, line, code)` of every ```python block of the README and the docs pages, or of one page."""
    blocks = []
    for path in documented_pages() if page is None else [page]:
        text = path.read_text()
        for match in _PYTHON_FENCE.finditer(text):
            blocks.append((_where(path), text.count('\n', 0, match.start()) + 1, match[1]))
    return blocks


_RUNNER = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, traceback
    from pathlib import Path

    import pydantic_ai.models
    from pydantic_ai.models.test import TestModel

    real = pydantic_ai.models.infer_model

    def infer_model(model, *args, **kwargs):
        if model == 'openai:gpt-5':  # the model the docs' blocks name
            return TestModel()
        return real(model, *args, **kwargs)

    pydantic_ai.models.infer_model = infer_model
    import pydantic_ai.durable_exec._base as durable_base  # resolves a request's model id the same way
    if getattr(durable_base, 'infer_model', None) is real:
        durable_base.infer_model = infer_model

    code, where, line, here, report = sys.argv[1:]
    os.chdir(here)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, f'{where}, block at line {line}', 'exec'), {'__name__': '__main__'})
    except BaseException:
        result = {'ok': False, 'error': traceback.format_exc()}
    else:
        result = {'ok': True, 'error': ''}
    Path(report).write_text(json.dumps({**result, 'output': out.getvalue()}))
    """
)


def _block_environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop('PYDANTIC_AI_DURABLE_DIR', None)  # the blocks' default journal: `.durable` in their own directory
    env['DB_PASSWORD'] = 'an-example-password'  # what the Secrets block reads, as a deployment would set it
    return env


def run_block(line: int, code: str, directory: Path, where: str = 'README.md') -> tuple[bool, str]:
    """Run one block of page `where` in a fresh interpreter in `directory`; return whether it succeeded, and why not."""
    if code.startswith('# test_') and code.split('\n', 1)[0].endswith('.py'):
        module = directory / code.split('\n', 1)[0].removeprefix('# ').strip()
        module.write_text(code)
        result = subprocess.run(
            [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', module.name],
            capture_output=True,
            text=True,
            cwd=directory,
            env=_block_environment(),
            timeout=600,
        )
        return result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = directory / 'report.json'
    result = subprocess.run(
        [sys.executable, '-c', _RUNNER, code, where, str(line), str(directory), str(report)],
        capture_output=True,
        text=True,
        env=_block_environment(),
        timeout=300,
    )
    if not report.exists():
        return False, result.stdout[-3000:] + result.stderr[-3000:]
    outcome = json.loads(report.read_text())
    return outcome['ok'], outcome['error'] + outcome['output'][-2000:] + result.stderr[-2000:]


@pytest.mark.parametrize(
    ('where', 'line', 'code'), python_blocks(), ids=[f'{where}:{line}' for where, line, _ in python_blocks()]
)
def test_python_block_runs(where: str, line: int, code: str, tmp_path: Path) -> None:
    """Each ```python block of the README and of every docs page runs as written, in a fresh interpreter
    and an empty directory.

    The blocks name a real model (`"openai:gpt-5"`), as a user's code does; here pydantic-ai's model
    inference turns exactly that name into `TestModel()`, so the blocks run offline without an API key
    and otherwise exactly as a user would run them (TestModel calls every tool and answers with text).
    The Secrets block reads `DB_PASSWORD` from the environment, which the test sets, as a deployment
    would. A block that is a pytest module (its first line names it, `# test_my_agent.py`) runs under
    pytest, in pytest-asyncio's strict mode. No block is exempt, except that a block using
    pydantic-ai-harness skips where no release of it fits the installed pydantic-ai-slim.
    """
    if 'pydantic_ai_harness' in code and (mismatch := harness_mismatch()) is not None:
        pytest.skip(f'{where}:{line} uses pydantic-ai-harness: {mismatch}')
    if 'HandleDeferredToolCalls' in code and importlib.util.find_spec('pydantic_ai.external_events') is None:
        pytest.skip(f'{where}:{line} waits on an external event, which pydantic-ai before 2.68 has not (EV-6)')
    ok, why = run_block(line, code, tmp_path, where)
    assert ok, f'{where} block at line {line} fails:\n{why}'


def test_a_failing_block_is_reported(tmp_path: Path) -> None:
    ok, why = run_block(1, 'from pydantic_ai_durable import Durable\nDurable(journal=search)\n', tmp_path, 'docs/x.md')
    assert not ok and "NameError: name 'search' is not defined" in why and 'docs/x.md, block at line 1' in why


def test_the_docs_have_python_blocks_to_run() -> None:
    """The README keeps its quick start; the pages hold the rest (12 blocks when the reference moved)."""
    assert len(python_blocks(README)) >= 1
    assert len(python_blocks()) >= 12


# -- the README is a guide, the pages are a site ---------------------------------------------------

README_LINES = 320
"""The README is the guide (what it is, install, the commands, a quick start, the guarantees, links);
the reference is in the pages under docs/."""

NOT_IN_NAV = {'architecture.md', 'rules.md'}
"""Pages that may stay out of mkdocs.yml's nav (both are in it today)."""


def test_the_readme_is_a_guide_of_at_most_320_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_LINES, f'README.md has {lines} lines: move reference material into a page under docs/'


def nav_pages(text: str | None = None) -> list[str]:
    """The pages mkdocs.yml's `nav` lists, relative to docs/ (read as text: PyYAML may not be installed)."""
    text = MKDOCS.read_text() if text is None else text
    nav = re.search(r'^nav:\n((?:[ \t]+.*\n?|\n)*)', text, re.M)
    assert nav is not None, 'mkdocs.yml has no nav'
    return re.findall(r'^\s*-\s*(?:[^\n]*?:\s*)?([\w./-]+\.md)\s*$', nav[1], re.M)


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    listed = nav_pages()
    pages = [str(page.relative_to(DOCS)) for page in docs_pages()]
    assert [page for page in pages if page not in listed and page not in NOT_IN_NAV] == []
    assert [page for page in listed if page not in pages] == [], 'mkdocs.yml lists pages that do not exist'
    assert len(listed) == len(set(listed)), 'mkdocs.yml lists a page twice'
    assert re.search(r'^strict: true$', MKDOCS.read_text(), re.M), 'mkdocs.yml must build strict'


def test_the_nav_reader_reads_nested_sections() -> None:
    text = 'site_name: x\nnav:\n  - Home: index.md\n  - Guide:\n      - A, b: a.md\n      - sub/c.md\nother: 1\n'
    assert nav_pages(text) == ['index.md', 'a.md', 'sub/c.md']


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's `toc` gives a heading (MkDocs' default): no markup, lower case, dashes."""
    text = re.sub(r'[^\w\s-]', '', heading.replace('`', '')).strip().lower()
    return re.sub(r'[-\s]+', '-', text)


def _anchors(page: Path) -> set[str]:
    prose = _FENCE.sub('', page.read_text())
    return {_slug(heading) for heading in re.findall(r'^#{1,6}\s+(.+?)\s*$', prose, re.M)}


def test_the_readme_links_to_pages_and_headings_that_exist() -> None:
    """MkDocs checks the links between pages (`strict`); the README is not a page, so it is checked here."""
    links = re.findall(r'\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)', README.read_text())
    assert links, 'the README links to no page under docs/'
    broken = [
        f'{path}#{anchor}' if anchor else path
        for path, anchor in links
        if not (ROOT / path).exists() or (anchor and anchor not in _anchors(ROOT / path))
    ]
    assert broken == []
    assert _slug('Reference: `pydantic_ai_durable.testing`') == 'reference-pydantic_ai_durabletesting'


def _walkthrough(page: Path) -> str:
    section = page.read_text().split('## Debugging a production run', 1)[1]
    return section.split('```bash\n', 1)[1].split('```', 1)[0]


def test_the_readme_walkthrough_is_the_cli_pages() -> None:
    """tests/test_transfer.py runs the README's walkthrough; the command-line page shows the same commands."""
    assert _walkthrough(README) == _walkthrough(DOCS / 'cli.md')
