"""An import's peak memory against the size of its file: seven 30 MiB payloads by default (XP-4).

An import holds its file's text and one stored value at a time, so its peak memory is a small multiple of
the file plus its largest value. This script writes an export file of `--payloads` entries, each a list of
numbers taking `--mib` MiB of JSON (the most Python objects per byte of JSON a file can hold), imports it
with the CLI into a new disk journal in a child process, and prints how much the child's peak resident
memory (VmHWM, Linux) grew during the import, next to the file's size.

    python benchmarks/import_memory.py                        # 7 x 30 MiB: a 210 MiB file
    python benchmarks/import_memory.py --payloads 7 --mib 6   # a 42 MiB file
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys
from pydantic_ai_durable._cli import main

def peak():
    line = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))
    return int(line.split()[1]) * 1024

baseline = peak()
code = main(['--journal', sys.argv[1], 'import', sys.argv[2]])
print(code, baseline, peak())
"""


def write_document(path: Path, payloads: int, mib: float) -> int:
    """An export of one run holding `payloads` entries of `mib` MiB each; returns the largest value's size."""
    elements = int(mib * 1024 * 1024) // 2  # "1," per element
    payload = '[' + ','.join(['1'] * elements) + ']'
    with path.open('w') as file:
        file.write(
            '{"format":"pydantic-ai-durable/execution","version":1,"key":"big","payloads":"plaintext",'
            '"key_ids":[],"exported":0,"state":"finished",'
            '"execution":{"v":1,"key":"big","runs":["0"],"status":"finished","attempts":1},'
            '"runs":[{"run":"0","records":{},"entries":['
        )
        for position in range(payloads):
            if position:
                file.write(',')
            file.write(f'{{"position":{position},"entry":{{"v":1,"name":"big","kind":"tool","payload":')
            file.write(payload)
            file.write('}}')
        file.write(']}]}')
    return len(payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--payloads', type=int, default=7)
    parser.add_argument('--mib', type=float, default=30.0, help='MiB of JSON per payload')
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / 'big.json'
        largest = write_document(path, options.payloads, options.mib)
        size = path.stat().st_size
        done = subprocess.run(
            [sys.executable, '-c', CHILD, str(Path(directory) / 'journal'), str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(done.stderr)
        code, baseline, peak = (int(part) for part in done.stdout.split()[-3:])
        if code != 0:
            sys.exit(f'the import failed: {done.stdout}')
    grown = peak - baseline
    mib = 1024 * 1024
    print('| file | largest value | peak memory grew by | times the file |')
    print('|---|---|---|---|')
    print(f'| {size / mib:.1f} MiB | {largest / mib:.1f} MiB | {grown / mib:.1f} MiB | {grown / size:.2f}x |')


if __name__ == '__main__':
    main()
