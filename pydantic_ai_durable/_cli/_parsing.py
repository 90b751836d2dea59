"""The CLI's command line: the commands, their options, and the durations and states they take.

Shared options are accepted before and after the command. A duration needs a unit (`30s`, `7d`): a bare
number would mean seconds to one reader and days to another, and a mistake here deletes executions.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from .._core import run_order
from ..journals import EXECUTION_STATES, ExecutionState

__all__ = ('PROG', 'Duration', 'build_parser', 'parse_duration', 'run_order')

PROG = 'pydantic-ai-durable'
_UNITS = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800}
_DURATION = re.compile(r'(?:\d+(?:\.\d+)?[smhdw])+')
_DURATION_PART = re.compile(r'(\d+(?:\.\d+)?)([smhdw])')

_EPILOG = """\
journal:
  --journal takes a directory (a DiskJournal) or a PostgreSQL DSN: a URL starting with
  postgresql:// or postgres://, or a libpq "key=value ..." string. Without it, the default
  journal is used: $PYDANTIC_AI_DURABLE_DIR, else .durable in the working directory. Nothing is
  ever created: a directory or Postgres schema that does not hold a journal is reported.

exit codes:
  0  success
  1  not found: an unknown KEY, or no journal at the given place; also a journal that cannot be
     opened (unreadable, a file, a refused connection) and a refused delete (a running execution),
     each reported as one line on stderr
  2  usage error: a bad command line, e.g. an --older-than that is not a duration

encryption:
  $PYDANTIC_AI_DURABLE_KEYS ("id:base64key,id:base64key", the current key first) gives the keys of a
  journal encrypted at rest; without it, sealed values are shown as sealed. rekey needs it: it
  rewrites every execution no attempt holds under the first key, and encrypts a plain journal;
  rekey --decrypt stores them in plain text again and clears the journal's marker of encryption.

Times in tables are local; --json gives UTC ISO-8601 strings and epoch seconds.
"""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `30s`, `15m`, `12h`, `7d`, `2w` or `1d12h`.

    A unit is required: a bare number would silently mean seconds to one reader and days to another,
    and a mistake here deletes executions.
    """
    cleaned = text.strip()
    if not _DURATION.fullmatch(cleaned):
        raise ValueError(
            f'invalid duration {text!r}: use numbers with a unit s, m, h, d or w (e.g. 30s, 15m, 12h, 7d, 2w, 1d12h)'
        )
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(cleaned))


@dataclass(frozen=True)
class Duration:
    """A parsed `--older-than`, keeping what the user typed for the messages."""

    seconds: float
    text: str


def _duration_argument(text: str) -> Duration:
    try:
        return Duration(parse_duration(text), text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser(prog: str) -> argparse.ArgumentParser:
    # The shared options are accepted before and after the command. The subparsers' copies default
    # to SUPPRESS so that a value given before the command is not overwritten by their default.
    def shared(parser: argparse.ArgumentParser, *, top: bool) -> None:
        parser.add_argument(
            '--journal',
            metavar='PATH|DSN',
            default=None if top else argparse.SUPPRESS,
            help='journal directory or PostgreSQL DSN (default: $PYDANTIC_AI_DURABLE_DIR, else .durable)',
        )
        parser.add_argument(
            '--schema',
            default=None if top else argparse.SUPPRESS,
            help='schema of a PostgreSQL journal (default: pydantic_ai_durable)',
        )
        parser.add_argument(
            '--json',
            action='store_true',
            default=False if top else argparse.SUPPRESS,
            help='print JSON for a program instead of a table',
        )

    parser = argparse.ArgumentParser(
        prog=prog,
        description='Inspect a pydantic-ai-durable journal: list, show, delete, prune, export, import, fork, '
        'decide the tool calls a waiting execution waits on, and serve the console.',
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shared(parser, top=True)
    commands = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)
    sub: dict[str, argparse.ArgumentParser] = {}
    for name, help_text in (
        ('list', 'list the executions in the journal'),
        ('show', 'show the runs and steps recorded for one execution'),
        ('delete', 'delete everything recorded for one execution'),
        ('prune', 'delete finished executions whose retention ended, or any not updated for a while'),
        ('rekey', 'rewrite every stored value under the current key of $PYDANTIC_AI_DURABLE_KEYS'),
        ('export', 'write one execution to a JSON file, to import into any journal'),
        ('import', 'write an exported execution into the journal, all of it or nothing'),
        ('fork', 'copy the steps of an execution before a step to a new key, whose retry runs the rest live'),
        ('approve', 'approve a tool call a waiting execution waits on; its next attempt runs the tool'),
        ('deny', 'deny a tool call a waiting execution waits on; the model is told so'),
        ('complete', 'give the result of a tool call a waiting execution waits on, from outside'),
        ('resolve-event', 'resolve a wait on an external event by its resume token; its next attempt goes on'),
        ('fail-event', 'fail a wait on an external event by its resume token; the run is told why'),
        ('cancel', "cancel an execution for good, with the provider's job it waits on; nothing more of it runs"),
        ('serve', 'serve the console in the browser (needs the extra console)'),
    ):
        sub[name] = commands.add_parser(name, help=help_text, description=help_text.capitalize() + '.')
        shared(sub[name], top=False)
    sub['show'].add_argument('key', metavar='KEY', help='the execution key')
    sub['show'].add_argument(
        '--messages', action='store_true', help="print a run's conversation as pydantic-ai messages (JSON)"
    )
    sub['show'].add_argument('--run', default='0', help='with --messages: which run (default 0)')
    sub['show'].add_argument(
        '--until', metavar='STEP', type=_step_number, default=None, help='with --messages: only the steps before STEP'
    )
    sub['export'].add_argument('key', metavar='KEY', help='the execution key')
    sub['export'].add_argument(
        '-o', '--output', metavar='FILE', default=None, help='the file to write (default: stdout)'
    )
    sub['export'].add_argument(
        '--plaintext',
        action='store_true',
        help="decrypt an encrypted journal's payloads into the file (needs $PYDANTIC_AI_DURABLE_KEYS)",
    )
    sub['rekey'].add_argument(
        '--decrypt',
        action='store_true',
        help="store every value in plain text again (needs the keys), and clear the journal's marker of encryption",
    )
    sub['import'].add_argument('file', metavar='FILE', help='an export file, or - for stdin')
    sub['import'].add_argument('--as', dest='as_key', metavar='KEY', default=None, help='import under another key')
    sub['import'].add_argument(
        '--force', action='store_true', help='replace an execution stored under the key (never a running one)'
    )
    sub['fork'].add_argument('key', metavar='KEY', help='the execution to fork (only read)')
    sub['fork'].add_argument('new_key', metavar='NEW_KEY', help='the key of the new execution')
    sub['fork'].add_argument(
        '--at',
        metavar='[RUN:]STEP',
        type=_step_argument,
        required=True,
        help='the first step to run live, as show numbers it',
    )
    sub['serve'].add_argument('--host', default='127.0.0.1', help='the address to bind (default 127.0.0.1)')
    sub['serve'].add_argument('--port', type=int, default=8765, help='the port (default 8765)')
    sub['serve'].add_argument(
        '--token',
        default=None,
        help='require this token (default: $PYDANTIC_AI_DURABLE_CONSOLE_TOKEN); needed for any host but 127.0.0.1',
    )
    sub['serve'].add_argument('--read-only', action='store_true', help='show everything, change nothing')
    sub['serve'].add_argument(
        '--by',
        metavar='NAME',
        default=None,
        help="who the console's decisions are recorded as (default: your user name)",
    )
    sub['serve'].add_argument(
        '--dispatch',
        metavar='MODULE',
        default=None,
        help="import MODULE, which defines the app's durable tasks, and send a task on through it when a decision "
        "leaves nothing pending (without it, the workers' sweep sends it after resume_after)",
    )
    sub['delete'].add_argument('key', metavar='KEY', help='the execution key')
    sub['delete'].add_argument(
        '--force', action='store_true', help='delete even while a live attempt holds the execution'
    )
    for name in ('approve', 'deny', 'complete'):
        sub[name].add_argument('key', metavar='KEY', help='the execution key')
        sub[name].add_argument('call_id', metavar='CALL_ID', help='the tool call id, as show lists it')
        sub[name].add_argument('--by', metavar='NAME', default=None, help='who decides (default: your user name)')
        sub[name].add_argument(
            '--dispatch',
            metavar='MODULE',
            default=None,
            help="import MODULE, which defines the app's durable tasks, and send the task on through it once its "
            "last call is decided (without it, the workers' sweep sends it after resume_after)",
        )
    for name in ('resolve-event', 'fail-event'):
        sub[name].add_argument(
            'token', metavar='TOKEN', help="the resume token the wait's ask was given (- reads stdin)"
        )
        sub[name].add_argument('--by', metavar='NAME', default=None, help='who resolves (default: your user name)')
        sub[name].add_argument(
            '--dispatch', metavar='MODULE', default=None, help="as approve's: send the task on through MODULE's fleet"
        )
    sub['resolve-event'].add_argument('--payload', metavar='JSON', required=True, help='the payload, as JSON')
    sub['fail-event'].add_argument('--reason', metavar='TEXT', required=True, help='why no payload is coming')
    sub['cancel'].add_argument('key', metavar='KEY', help='the execution key')
    sub['cancel'].add_argument('--reason', metavar='TEXT', required=True, help='why it is cancelled (recorded)')
    sub['cancel'].add_argument(
        '--dispatch', metavar='MODULE', default=None, help="as approve's: send the task on through MODULE's fleet"
    )
    sub['deny'].add_argument('--message', metavar='TEXT', default=None, help='what the model is told')
    sub['complete'].add_argument('--result', metavar='JSON', required=True, help="the tool's result, as JSON")
    states = {
        'list': 'only executions in these states: running, interrupted, waiting, failed, finished, corrupt',
        'prune': 'with --older-than: which states to delete (default finished; also interrupted, waiting, failed)',
    }
    for name, help_text in states.items():
        sub[name].add_argument('--state', metavar='STATE[,STATE]', type=_states_argument, default=None, help=help_text)
    sub['prune'].add_argument(
        '--older-than',
        metavar='DURATION',
        type=_duration_argument,
        default=None,
        help='age since the last write, e.g. 30s, 15m, 12h, 7d, 2w or 1d12h '
        '(without it: finished executions whose retention ended)',
    )
    return parser


def _step_number(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f'invalid step {text!r}: a step number as `show` prints it')
    return int(text)


def _step_argument(text: str) -> tuple[str, int]:
    run, _, step = text.strip().rpartition(':')
    if not step.isdigit() or (run and not run.isdigit()):
        raise argparse.ArgumentTypeError(
            f'invalid step {text!r}: a step number as `show` prints it, or RUN:STEP (4, 1:4)'
        )
    return run or '0', int(step)


def _states_argument(text: str) -> tuple[ExecutionState, ...]:
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in EXECUTION_STATES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f'invalid state {", ".join(unknown) or repr(text)}: use {", ".join(EXECUTION_STATES)} (comma-separated)'
        )
    return tuple(name for name in EXECUTION_STATES if name in names)
