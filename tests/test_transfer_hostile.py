"""Export files Python's own JSON reader will not take, and a run with an entry taken out (XP-4).

Each file is a real export with one value changed in its text: a payload nested 100,000 levels deep, an
integer of 5,000 digits, a payload that is not JSON at all, and a run whose entry at a position a later
entry was recorded after is gone. The real command line imports each into a disk journal that already holds
an execution: one line on standard error, a non-zero exit, and the journal unchanged byte for byte; the
Python call refuses the same texts with `ExportInvalid`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from stores import disk_store
from test_transfer import Shop, _close, _exported, _record
from test_transfer_faults import _cli, _one_line

from pydantic_ai_durable import ExportInvalid, MemoryJournal, execution, import_execution

pytestmark = pytest.mark.once  # the package's own machinery, whatever the pydantic-ai release: CI's second job skips it

PAYLOAD = '"hostile-payload-marker"'


def _with_payload(document: dict[str, Any], text: str) -> str:
    """The export's text with the payload of its second entry (a tool's result) replaced by `text`, verbatim."""
    edited = json.loads(json.dumps(document))
    edited['runs'][0]['entries'][1]['entry']['payload'] = json.loads(PAYLOAD)
    whole = json.dumps(edited)
    assert whole.count(PAYLOAD) == 1
    return whole.replace(PAYLOAD, text)


def _without_entry(document: dict[str, Any], position: int) -> str:
    edited = json.loads(json.dumps(document))
    entries = edited['runs'][0]['entries']
    assert any(item['entry'].get('after') == position for item in entries)  # a later entry was written after it
    edited['runs'][0]['entries'] = [item for item in entries if item['position'] != position]
    return json.dumps(edited)


def _files(document: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each hostile text, with what its one line must say."""
    return {
        'nested 100,000 levels deep': (_with_payload(document, '[' * 100_000 + ']' * 100_000), 'nests deeper'),
        'an integer of 5,000 digits': (_with_payload(document, '9' * 5_000), 'more than 4300 digits'),
        'a payload that is not JSON': (_with_payload(document, '{"a": tru}'), 'is not JSON text'),
        'a run with an entry taken out': (_without_entry(document, 2), 'no entry at position 2'),
    }


def test_xp4_the_cli_refuses_what_pythons_json_reader_refuses_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    store = disk_store(tmp_path)
    assert store.cli is not None

    async def prepare() -> dict[str, Any]:
        journal = store.make(None)
        await _record(journal, Shop(), key='already-here')
        await _close(journal)
        return await _exported()

    document = asyncio.run(prepare())
    before = store.raw()
    for case, (text, says) in _files(document).items():
        path = tmp_path / 'hostile.json'
        path.write_text(text)
        line = _one_line(_cli(*store.cli, 'import', str(path)))
        assert 'Not imported' in line and says in line and 'set_int_max_str_digits' not in line, (case, line)
        assert store.raw() == before, case


UNREADABLE = ['nested 100,000 levels deep', 'an integer of 5,000 digits', 'a payload that is not JSON']


@pytest.mark.parametrize('case', UNREADABLE)
async def test_xp4_import_execution_refuses_text_pythons_json_reader_refuses(case: str) -> None:
    document = await _exported()
    text, says = _files(document)[case]
    target = MemoryJournal()
    with pytest.raises(ExportInvalid, match=says):
        await import_execution(target, text)
    assert await target.list_executions() == []


async def test_xp4_en3_a_run_missing_a_position_a_later_entry_was_written_after_is_refused_at_the_import() -> None:
    document = await _exported()
    target = MemoryJournal()
    for given in (_without_entry(document, 2), json.loads(_without_entry(document, 2))):  # text, and a Python document
        with pytest.raises(ExportInvalid, match='run 0 has no entry at position 2, though its entry at position 3'):
            await import_execution(target, given)
    assert await target.list_executions() == []
    # A position never recorded is no hole: the same run without its last entry imports and replays.
    cut = json.loads(json.dumps(document))
    cut['runs'][0]['entries'].pop()
    assert (await import_execution(target, cut)).steps == len(document['runs'][0]['entries']) - 1
    shop = Shop()
    async with execution('order-42', journal=target):
        await shop.agent(target).run('order for walrus-marker-51ab')
    assert shop.model_calls == 1  # only the step cut off ran live
