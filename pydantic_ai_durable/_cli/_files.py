"""The files `import` reads and `export` writes.

An import reads a regular file or standard input (`-`), nothing else: a FIFO nobody writes to would hang it
forever, and a device would be read to the size limit. The file is decoded to text at once and its bytes let
go, so the import holds one copy of it. An export goes to standard output (`-`), to a regular file written
whole or not at all (a temporary file beside it, renamed into place), or through to the pipe or terminal a
path names (`/dev/stdout`). A symbolic link is followed, never replaced: the file it names is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO

from ..journals import DATABASE
from ._render import cell
from ._target import EXIT_USAGE, Failure

__all__ = ('read_document', 'write_export')

_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return 'a directory'
    if stat.S_ISFIFO(mode):
        return 'a FIFO (named pipe)'
    if stat.S_ISCHR(mode):
        return 'a character device'
    if stat.S_ISBLK(mode):
        return 'a block device'
    if stat.S_ISSOCK(mode):
        return 'a socket'
    return 'not a file'


def read_document(source: str, limit: int) -> str:
    """The text of an export file or of standard input, at most `limit` bytes; anything else is a `Failure`."""
    shown = cell(source, 200)
    try:
        if source == '-':
            data = _read_up_to(sys.stdin.buffer, limit + 1, _CHUNK)
        else:
            # O_NONBLOCK: opening a FIFO must not wait for a writer before we can see that it is one.
            handle = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, 'O_NOCTTY', 0))
            try:
                status = os.fstat(handle)
            except BaseException:
                os.close(handle)
                raise
            mode = status.st_mode
            if not stat.S_ISREG(mode):
                os.close(handle)
                raise Failure(
                    f'Not imported: {shown} is {_kind(mode)}, not a regular file; give an export file, or - to read '
                    'standard input. Nothing was written.'
                )
            with os.fdopen(handle, 'rb') as file:
                data = _read_up_to(file, limit + 1, min(status.st_size, limit) + 1)
    except OSError as exc:
        raise Failure(f'cannot read {shown}: {exc.strerror or exc}') from None
    if len(data) > limit:
        raise Failure(f'Not imported: {shown} is larger than the {limit} bytes an import takes. Nothing was written.')
    try:
        return data.decode(json.detect_encoding(data), 'surrogatepass')  # the bytes go when this returns
    except (UnicodeDecodeError, LookupError):
        raise Failure(f'Not imported: {shown} is not JSON text (it does not decode). Nothing was written.') from None


def _read_up_to(file: BinaryIO, most: int, first: int) -> bytes:
    """At most `most` bytes, read as `first` bytes then in chunks: a read's buffer is as large as it asks."""
    chunks = [file.read(first)]
    total = len(chunks[0])
    while total < most:
        chunk = file.read(min(_CHUNK, most - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return chunks[0] if len(chunks) == 1 else b''.join(chunks)


_JOURNAL_FILES = frozenset((DATABASE, f'{DATABASE}-wal', f'{DATABASE}-shm', f'{DATABASE}-journal'))
"""The files SQLite keeps for a disk journal's database: an export must never be renamed over one."""


def write_export(output: str, text: str) -> bool:
    """Write the export to `output` (`-`: standard output); `True` when it went to a regular file."""
    if output == '-':
        sys.stdout.write(text + '\n')
        sys.stdout.flush()
        return False
    path = Path(output)
    shown = cell(output, 200)
    resolved = Path(os.path.realpath(path))
    if resolved.name in _JOURNAL_FILES and (resolved.parent / DATABASE).exists():
        raise Failure(
            f'cannot write {shown}: it is a file of the disk journal in {cell(str(resolved.parent), 200)}, which the '
            'export would replace and so destroy; nothing was written. Write the export anywhere else',
            EXIT_USAGE,
        )
    try:
        mode = os.stat(path).st_mode  # through links
    except FileNotFoundError:
        mode = None  # a new file, or a link to one
    except OSError as exc:
        raise Failure(f'cannot write {shown}: {exc.strerror or exc}', EXIT_USAGE) from None
    if mode is not None and not stat.S_ISREG(mode):
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise Failure(
                f'cannot write {shown}: it is {_kind(mode)}, not a regular file, a pipe or a terminal; nothing was '
                'written (-o - writes to standard output)',
                EXIT_USAGE,
            )
        try:  # a pipe or a terminal (/dev/stdout): written through as it is, never replaced
            with open(path, 'w', encoding='ascii') as file:
                file.write(text + '\n')
        except OSError as exc:
            raise Failure(f'cannot write {shown}: {exc.strerror or exc}') from None
        return False
    _write_whole(Path(os.path.realpath(path)) if path.is_symlink() else path, text, shown)
    return True


def _write_whole(path: Path, text: str, shown: str) -> None:
    """Write to a temporary file beside `path` and rename it: a killed export leaves no half file."""
    directory = path.parent if str(path.parent) else Path('.')
    try:
        handle, temporary = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=directory)
    except OSError as exc:
        raise Failure(f'cannot write {shown}: {exc.strerror or exc}', EXIT_USAGE) from None
    try:
        with os.fdopen(handle, 'w', encoding='ascii') as file:
            file.write(text + '\n')
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise Failure(f'cannot write {shown}: {exc.strerror or exc}') from None
        raise
