"""Payloads encrypted at rest (EN-1..EN-6): AES-GCM under the user's keys, each value bound to its place.

A backend stores what the core hands it; with `encryption=` it first moves every field that may hold the
user's data (payloads, tool calls, fingerprints, run records, metadata) into one sealed field, and leaves in
clear only what the engine and the CLI must read without keys: versions, names, kinds, times and states.
The sealed text is authenticated together with the execution key, the value's place and its clear fields,
so an altered byte, an edited name or a value copied to another place fails to open instead of replaying.
A store once written with keys keeps a marker of it, which a journal object without keys is refused by
before it takes a lease, so no plain value lands beside sealed ones.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .._errors import EncryptionMismatch, JournalCorrupt
from ._json import undecoded

__all__ = ('KEYS_VARIABLE', 'SEALED', 'Encryption', 'Sealer', 'clear_marker', 'plain_values_opened', 'reseal')

KEYS_VARIABLE = 'PYDANTIC_AI_DURABLE_KEYS'
"""Where `Encryption.from_env()` and the CLI read keys: `id:base64key[,id:base64key...]`, current first."""

SEALED = 'sealed'
"""The field of a stored value that holds its encrypted part: `{"k": key id, "c": base64(nonce + ciphertext)}`."""

_ENTRY_CLEAR = frozenset({'v', 'name', 'kind', 't', 'a', 's', 'matched', 'origin'})
"""What an entry keeps in clear: how the CLI names and dates a step, never what it was asked or returned.
Fingerprints are sealed too: a digest of a short secret (a PIN in a prompt, a tool argument) is a dictionary
lookup away, and the engine only compares them once the entry is open."""
_EXECUTION_SEALED = frozenset({'metadata', 'deferred'})
"""What an execution record seals: the rest is bookkeeping every backend reads (status, retention, runs); the calls
it waits on, with their arguments and decisions, are the user's data."""
_KEY_ID = re.compile(r'[A-Za-z0-9_.-]{1,64}')
_NONCE = 12

Place = tuple[str, ...]
Mode = Literal['strict', 'show', 'migrate', 'decrypt']


class Encryption:
    """The user's keys: the first seals every new value, any of them opens a stored one (EN-2).

    `keys` maps a key id (letters, digits, `_.-`, at most 64) to 16, 24 or 32 bytes of key (AES-GCM). The id
    is stored beside each value, so a value sealed under an older key stays readable while that key is
    listed. Keys come from the caller or from the environment (`from_env`), never from a file the package writes.
    """

    def __init__(self, keys: Mapping[str, bytes] | Sequence[tuple[str, bytes]]) -> None:
        pairs = list(keys.items()) if isinstance(keys, Mapping) else list(keys)
        if not pairs:
            raise ValueError('Encryption needs at least one key: {"key-id": 32 random bytes}, the current one first.')
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:  # pragma: no cover - only without the extra
            raise ImportError(
                "Encryption at rest needs the 'cryptography' package, the extra 'encryption' of "
                f"pydantic-ai-durable-journal: pip install 'pydantic-ai-durable-journal[encryption]' ({exc})."
            ) from exc
        # No message below shows an id or a key: a key pasted where its id goes would be printed.
        self._ciphers: dict[str, Any] = {}
        numbers: dict[str, int] = {}
        for number, pair in enumerate(pairs, 1):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(f'Key number {number} is not a pair of an id and a key.')
            key_id, key = pair
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise ValueError(
                    f'Key number {number}: its key id ({_shape(key_id)}) is not 1 to 64 letters, digits or "_.-". '
                    'Keys are given by id, the id first: {"2026-12": os.urandom(32)}.'
                )
            if not isinstance(key, bytes) or len(key) not in (16, 24, 32):
                raise ValueError(
                    f'Key number {number} must be 16, 24 or 32 bytes (os.urandom(32)), not {_shape(key)}; '
                    'a passphrase is not a key.'
                )
            if key_id in numbers:
                raise ValueError(
                    f'Keys number {numbers[key_id]} and {number} have the same id; every key needs an id of its own.'
                )
            numbers[key_id] = number
            self._ciphers[key_id] = AESGCM(key)
        self.current = pairs[0][0]
        """The id of the key new values are sealed with."""

    @classmethod
    def from_env(cls, variable: str = KEYS_VARIABLE) -> Encryption:
        """Keys from an environment variable: `id:base64key,id:base64key`, the current key first."""
        text = os.environ.get(variable, '').strip()
        if not text:
            raise ValueError(
                f'${variable} is not set: give it the keys as "id:base64key" (python -c "import base64, os; '
                'print(base64.b64encode(os.urandom(32)).decode())"), the current one first, separated by commas.'
            )
        items = text.split(',')
        pairs: list[tuple[str, bytes]] = []
        for number, item in enumerate(items, 1):  # items by number only: never a piece of one
            key_id, colon, encoded = item.strip().partition(':')
            if not colon:
                raise ValueError(
                    f'${variable}: item {number} of {len(items)} has no id: write each key as "id:base64key", '
                    'separated by commas.'
                )
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f'${variable}: the key of item {number} of {len(items)} is not base64 text.') from None
            pairs.append((key_id.strip(), key))
        try:
            return cls(pairs)
        except ValueError as exc:
            raise ValueError(f'${variable}: {exc}') from None

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def __repr__(self) -> str:
        return f'Encryption(current={self.current!r}, keys={list(self._ciphers)!r})'  # never the keys themselves

    def seal(self, secret: dict[str, Any], bound: bytes) -> dict[str, str]:
        nonce = os.urandom(_NONCE)
        text = json.dumps(secret, separators=(',', ':'), ensure_ascii=True).encode()
        sealed = self._ciphers[self.current].encrypt(nonce, text, bound)
        return {'k': self.current, 'c': base64.b64encode(nonce + sealed).decode()}

    def cipher(self, key_id: str) -> Any:
        return self._ciphers.get(key_id)


class Sealer:
    """What a backend calls on the way to its store and back; without `encryption` it only spots sealed values.

    `mode`: `strict` (the engine: a value that does not fit the keys raises), `show` (the CLI without keys:
    sealed values come back sealed, for display), `migrate` (`rekey`: plain values are accepted, to be
    sealed when written back), `decrypt` (`rekey --decrypt`: values are opened and written back plain).
    """

    def __init__(self, encryption: Encryption | None, mode: Mode = 'strict') -> None:
        if encryption is not None and not isinstance(encryption, Encryption):
            raise TypeError(f'encryption must be an Encryption (or None), not {type(encryption).__name__}.')
        self.encryption = encryption
        self.mode: Mode = mode
        self.plain_opened = 0
        """Plain values read in `migrate` mode: what `rekey` seals, whose old text the store may keep."""

    # -- the three kinds of stored value -----------------------------------------------------------------

    def entry(self, key: str, run: str, position: int, value: dict[str, Any]) -> dict[str, Any]:
        return self._seal(value, ('entry', key, run, str(position)), lambda field: field not in _ENTRY_CLEAR)

    def open_entry(self, key: str, run: str, position: int, value: Any) -> Any:
        return self._open(value, ('entry', key, run, str(position)), f'run {run}, step {position}')

    def record(self, key: str, run: str, name: str, value: dict[str, Any]) -> dict[str, Any]:
        return self._seal(value, ('record', key, run, name), lambda field: field != 'v')

    def open_record(self, key: str, run: str, name: str, value: Any) -> Any:
        return self._open(value, ('record', key, run, name), f'run {run}, record {name!r}')

    def execution(self, key: str, value: dict[str, Any]) -> dict[str, Any]:
        return self._seal(value, ('execution', key), lambda field: field in _EXECUTION_SEALED)

    def open_execution(self, key: str, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None  # nothing stored
        opened = self._open(value, ('execution', key), 'the execution record')
        return opened if isinstance(opened, dict) else None

    # -- the journal's marker -------------------------------------------------------------------------

    def admit(self, key: str, marker: object, where: str) -> str | None:
        """Judge the store's marker as a lease on `key` is taken; return the marker text to store, if it changes.

        `marker` is what the store holds (`None`: no marker), `where` names it for the message. A journal
        without keys is refused on a marked store, before it writes anything; one with keys marks the store
        with its current key id, so a later journal without keys is refused there. `rekey --decrypt`
        (`decrypt` mode) leaves the marker for its end, which clears it once everything is plain.
        """
        ids = _marker_ids(marker)
        if self.encryption is None:
            if ids is None:
                return None
            named = ', '.join(repr(key_id) for key_id in ids) or 'unknown'
            raise EncryptionMismatch(
                f'Execution {key!r}: this journal is sealed, and was opened without keys. {where} says it was '
                f'given encryption keys (key ids {named}); recording here without them would store plain text '
                f'beside sealed values. Give the journal the keys with those ids: encryption=Encryption({{...}}), '
                f'or Encryption.from_env() with ${KEYS_VARIABLE} set (the CLI reads ${KEYS_VARIABLE} too). To '
                'store plain text here again on purpose, run `pydantic-ai-durable --journal ... rekey --decrypt` '
                'with the keys, which clears the marker. Nothing was written and no model was called.',
                key=key,
                where=where,
                key_id=ids[0] if ids else None,
            )
        if self.mode == 'decrypt' or (ids is not None and self.encryption.current in ids):
            return None
        known = [key_id for key_id in ids or () if key_id != self.encryption.current]
        return json.dumps({'v': 1, 'key_ids': [self.encryption.current, *known], 'marked': time.time()})

    # -- mechanics ------------------------------------------------------------------------------------

    def _seal(self, value: dict[str, Any], place: Place, sealed: Any) -> dict[str, Any]:
        if self.encryption is None or self.mode == 'decrypt' or not isinstance(value, dict):
            return value
        clear: dict[str, Any] = {}
        secret: dict[str, Any] = {}
        for field, item in value.items():
            if field != SEALED:
                (secret if sealed(field) else clear)[field] = item
        try:
            return {**clear, SEALED: self.encryption.seal(secret, _bound(place, clear))}
        except (TypeError, ValueError, RecursionError, OverflowError):
            return value  # not JSON: the backend's own encoding refuses it, sealed or not

    def _open(self, value: Any, place: Place, where: str) -> Any:
        key = place[1]
        if not isinstance(value, dict) or undecoded(value):
            if self.encryption is not None and self.mode != 'show':
                raise JournalCorrupt(
                    f'Execution {key!r}, {where}: the stored value does not decode (it is not the JSON object that '
                    'was written). In a journal with keys that can only be damage or tampering, so it is neither '
                    'replayed nor run again; restore the journal from a backup, or delete the execution to start '
                    'it over.',
                    key=key,
                    where=where,
                )
            return value  # without keys, a miss the core reports once
        sealed = value.get(SEALED)
        if sealed is None:
            if self.encryption is not None and self.mode == 'strict':
                raise EncryptionMismatch(
                    f'Execution {key!r}, {where}: stored in plain text, but this journal was given encryption keys. '
                    'It was written before encryption was turned on; encrypt what is stored with '
                    '`pydantic-ai-durable --journal ... rekey` (keys in $PYDANTIC_AI_DURABLE_KEYS), or open the '
                    'journal without encryption. Nothing was replayed or run.',
                    key=key,
                    where=where,
                )
            if self.encryption is not None and self.mode == 'migrate':
                self.plain_opened += 1
            return value
        if self.encryption is None:
            if self.mode == 'show':
                return value
            key_id = _key_id(sealed)
            raise EncryptionMismatch(
                f'Execution {key!r}, {where}: encrypted (key id {key_id!r}), but this journal was given no '
                'keys. Pass encryption=Encryption({...}) to the journal (or set $PYDANTIC_AI_DURABLE_KEYS for the '
                'CLI). Nothing was replayed or run.',
                key=key,
                where=where,
                key_id=key_id,
            )
        clear = {field: item for field, item in value.items() if field != SEALED}
        return {**clear, **self._decrypt(sealed, _bound(place, clear), key, where)}

    def _decrypt(self, sealed: Any, bound: bytes, key: str, where: str) -> dict[str, Any]:
        assert self.encryption is not None
        key_id = _key_id(sealed)
        cipher = self.encryption.cipher(key_id) if key_id is not None else None
        if key_id is not None and cipher is None:
            raise EncryptionMismatch(
                f'Execution {key!r}, {where}: sealed with key id {key_id!r}, which is not among the keys given '
                f'({", ".join(self.encryption.key_ids)}). Add that key (rotated keys stay listed until '
                '`rekey` has rewritten everything under the current one). Nothing was replayed or run.',
                key=key,
                where=where,
                key_id=key_id,
            )
        try:
            if cipher is None:
                raise ValueError('no key id')
            blob = base64.b64decode(sealed['c'], validate=True)
            text = cipher.decrypt(blob[:_NONCE], blob[_NONCE:], bound)
            secret = json.loads(text)
        except Exception as exc:  # InvalidTag, bad base64, a missing field: all mean it is not what was sealed
            raise JournalCorrupt(
                f'Execution {key!r}, {where}: the encrypted value failed authentication ({type(exc).__name__}). '
                f'It was altered, copied from another execution or place, or key {key_id!r} is not the key it was '
                'sealed with. It is neither replayed nor run again; restore the journal from a backup, or delete '
                'the execution to start it over.',
                key=key,
                where=where,
            ) from None
        if not isinstance(secret, dict):
            raise JournalCorrupt(
                f'Execution {key!r}, {where}: the decrypted value is not an object.', key=key, where=where
            )
        return secret


def _bound(place: Place, clear: dict[str, Any]) -> bytes:
    """The associated data: where the value lives and what it shows in clear, so neither can be changed."""
    return json.dumps([*place, clear], sort_keys=True, separators=(',', ':'), ensure_ascii=True).encode()


def _shape(value: object) -> str:
    """What a value given as a key or an id is, without a character of it: for messages."""
    size = f' of {len(value)}' if isinstance(value, (str, bytes)) else ''
    return f'{type(value).__name__}{size}'


def _marker_ids(marker: object) -> list[str] | None:
    """The key ids a stored marker names; `None` without a marker, `[]` for one that does not read (still a marker)."""
    if marker is None:
        return None
    try:
        ids = json.loads(marker).get('key_ids') if isinstance(marker, (str, bytes)) else None
    except (ValueError, AttributeError, RecursionError):
        ids = None
    if not isinstance(ids, list):
        return []
    return [key_id for key_id in ids if isinstance(key_id, str) and _KEY_ID.fullmatch(key_id)]


def _key_id(sealed: Any) -> str | None:
    key_id = sealed.get('k') if isinstance(sealed, dict) else None
    return key_id if isinstance(key_id, str) else None


def _sealer_of(journal: object) -> Sealer:
    sealer = getattr(journal, '_sealer', None)
    if not isinstance(sealer, Sealer):
        raise TypeError(f'{type(journal).__name__} is not a backend of this package: it has no encryption layer.')
    return sealer


def reseal(journal: object, encryption: Encryption | None, mode: Mode) -> None:
    """Give one of this package's backends new keys and a mode (the CLI's `show` without keys, `rekey`'s `migrate`)."""
    _sealer_of(journal)
    journal._sealer = Sealer(encryption, mode)  # type: ignore[attr-defined]


def plain_values_opened(journal: object) -> int:
    """How many plain values a journal in `migrate` mode has read: what `rekey` sealed."""
    return _sealer_of(journal).plain_opened if getattr(journal, '_sealer', None) is not None else 0


async def clear_marker(journal: object) -> None:
    """Remove the store's marker of encryption: only `rekey --decrypt`, once every value is plain, does."""
    if _sealer_of(journal).mode != 'decrypt':
        raise ValueError('Only a journal rewritten to plain text (rekey --decrypt) may lose its marker of encryption.')
    await journal._clear_marker()  # type: ignore[attr-defined]
