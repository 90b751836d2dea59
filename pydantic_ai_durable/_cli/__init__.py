"""`python -m pydantic_ai_durable`: list, show, delete, prune, rekey, export, import, fork, resolve, serve (CLI-1).

When a retry costs money again, a user needs to see what the journal held and where replay stopped,
without writing code. The CLI only works on a journal that already exists: it never creates a
directory or a database schema, so a mistyped path is reported instead of silently becoming an empty
journal. Modules: `_parsing` (the command line), `_target` (opening the journal), `_render`, `_commands`, `_transfer`
(export, import, fork, messages), `_files` (the files they read and write), `_waiting` (approve, deny, complete,
resolve-event, fail-event, and the calls `show` lists), `_serve` (the console).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ._commands import delete_command, list_command, prune_command, rekey_command, show_command
from ._parsing import PROG, build_parser, parse_duration, run_order
from ._render import escape
from ._serve import serve_command
from ._target import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, Failure, open_target
from ._transfer import export_command, fork_command, import_command, messages_command
from ._waiting import cancel_command, decide_command, event_command

__all__ = ('EXIT_NOT_FOUND', 'EXIT_OK', 'EXIT_USAGE', 'main', 'parse_duration', 'run_order')


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the CLI with `argv` (default: the process's arguments) and return the exit code (CLI-2)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, 'reconfigure', None)
        if reconfigure is not None:  # a key a terminal cannot show must not crash the listing
            reconfigure(errors='backslashreplace')
    parser = build_parser(prog or PROG)
    options = parser.parse_args(arguments)  # exits with EXIT_USAGE on a bad command line
    try:
        command = options.command
        if command == 'serve':
            return serve_command(
                options.journal,
                options.schema,
                host=options.host,
                port=options.port,
                token=options.token,
                read_only=options.read_only,
                by=options.by,
                dispatch=options.dispatch,
            )
        decrypt = command == 'rekey' and options.decrypt
        target = open_target(
            options.journal, options.schema, rekeying=command == 'rekey', decrypt=decrypt, creating=command == 'import'
        )
        if options.command == 'rekey':
            return rekey_command(target, options.json, decrypt=decrypt)
        if options.command == 'list':
            return list_command(target, options.state, options.json)
        if options.command == 'show' and options.messages:
            return messages_command(target, options.key, options.run, options.until)
        if options.command == 'show':
            return show_command(target, options.key, options.json)
        if options.command == 'export':
            return export_command(
                target, options.key, options.output, plaintext=options.plaintext, as_json=options.json
            )
        if options.command == 'import':
            return import_command(
                target, options.file, as_key=options.as_key, force=options.force, as_json=options.json
            )
        if options.command == 'fork':
            return fork_command(target, options.key, options.new_key, options.at, as_json=options.json)
        if options.command in ('approve', 'deny', 'complete'):
            return decide_command(
                target,
                command,
                options.key,
                options.call_id,
                message=getattr(options, 'message', None),
                result=getattr(options, 'result', None),
                by=options.by,
                dispatch=options.dispatch,
                as_json=options.json,
            )
        if options.command in ('resolve-event', 'fail-event'):
            return event_command(
                target,
                command,
                options.token,
                payload=getattr(options, 'payload', None),
                reason=getattr(options, 'reason', None),
                by=options.by,
                dispatch=options.dispatch,
                as_json=options.json,
            )
        if options.command == 'cancel':
            return cancel_command(
                target, options.key, reason=options.reason, dispatch=options.dispatch, as_json=options.json
            )
        if options.command == 'delete':
            return delete_command(target, options.key, force=options.force, as_json=options.json)
        return prune_command(target, options.older_than, options.state, options.json)
    except Failure as failure:
        message = escape(' '.join(str(failure).splitlines()))
        if failure.code == EXIT_USAGE:
            parser.error(message)
        print(f'{parser.prog}: {message}', file=sys.stderr)
        return failure.code
    except KeyboardInterrupt:
        print(f'{parser.prog}: interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader is gone, so is the need to print
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
