"""Payloads encrypted at rest (EN-1..EN-5): AES-GCM under the user's keys, each value bound to its place.

A backend stores what the core hands it; with `encryption=` it first moves every field that may hold the
user's data (payloads, tool calls, run records, metadata) into one sealed field, and leaves in clear only
what the engine must read without keys: versions, names, kinds, fingerprints, times and states. The
sealed text is authenticated together with the execution key, the value's place and its clear fields,
so an altered byte, an edited name or a value copied to another place fails to open instead of replaying.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .._errors import EncryptionMismatch, JournalCorrupt

__all__ = ('KEYS_VARIABLE', 'SEALED', 'Encryption', 'Sealer', 'reseal')

KEYS_VARIABLE = 'PYDANTIC_AI_DURABLE_KEYS'
"""Where `Encryption.from_env()` and the CLI read keys: `id:base64key[,id:base64key...]`, current first."""

SEALED = 'sealed'
"""The field of a stored value that holds its encrypted part: `{"k": key id, "c": base64(nonce + ciphertext)}`."""

_ENTRY_CLEAR = frozenset({'v', 'name', 'kind', 'fingerprint', 't', 'start', 'matched', 'origin'})
"""What an entry keeps in clear: how the engine and the CLI find and match a step, never what it returned."""
_EXECUTION_SEALED = frozenset({'metadata', 'deferred'})
"""What an execution record seals: the rest is bookkeeping every backend reads (status, retention, runs); the calls
it waits on, with their arguments and decisions, are the user's data (WT-1)."""
_KEY_ID = re.compile(r'[A-Za-z0-9_.-]{1,64}')
_NONCE = 12

Place = tuple[str, ...]
Mode = Literal['strict', 'show', 'migrate']


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
        self._ciphers: dict[str, Any] = {}
        for key_id, key in pairs:
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise ValueError(f'A key id is 1 to 64 letters, digits or "_.-", not {key_id!r}.')
            if not isinstance(key, bytes) or len(key) not in (16, 24, 32):
                size = f'{len(key)} bytes' if isinstance(key, bytes) else type(key).__name__
                raise ValueError(
                    f'Key {key_id!r} must be 16, 24 or 32 bytes (os.urandom(32)), not {size}; '
                    'a passphrase is not a key.'
                )
            if key_id in self._ciphers:
                raise ValueError(f'Key id {key_id!r} is given twice; every key needs an id of its own.')
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
        pairs: list[tuple[str, bytes]] = []
        for item in text.split(','):
            key_id, _, encoded = item.strip().partition(':')
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f'${variable}: the key of {key_id!r} is not base64 text.') from None
            pairs.append((key_id.strip(), key))
        return cls(pairs)

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
    sealed when written back).
    """

    def __init__(self, encryption: Encryption | None, mode: Mode = 'strict') -> None:
        if encryption is not None and not isinstance(encryption, Encryption):
            raise TypeError(f'encryption must be an Encryption (or None), not {type(encryption).__name__}.')
        self.encryption = encryption
        self.mode: Mode = mode

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
        opened = self._open(value, ('execution', key), 'the execution record')
        return opened if isinstance(opened, dict) else None

    # -- mechanics ------------------------------------------------------------------------------------

    def _seal(self, value: dict[str, Any], place: Place, sealed: Any) -> dict[str, Any]:
        if self.encryption is None or not isinstance(value, dict):
            return value
        clear: dict[str, Any] = {}
        secret: dict[str, Any] = {}
        for field, item in value.items():
            if field != SEALED:
                (secret if sealed(field) else clear)[field] = item
        try:
            return {**clear, SEALED: self.encryption.seal(secret, _bound(place, clear))}
        except (TypeError, ValueError, RecursionError, OverflowError):
            return value  # not JSON: the backend's own encoding refuses it, sealed or not (J-2)

    def _open(self, value: Any, place: Place, where: str) -> Any:
        if not isinstance(value, dict):
            return value  # undecodable text stays a miss the core reports (J-3)
        key = place[1]
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


def _key_id(sealed: Any) -> str | None:
    key_id = sealed.get('k') if isinstance(sealed, dict) else None
    return key_id if isinstance(key_id, str) else None


def reseal(journal: object, encryption: Encryption | None, mode: Mode) -> None:
    """Give one of this package's backends new keys and a mode (the CLI's `show` without keys, `rekey`'s `migrate`)."""
    if not isinstance(getattr(journal, '_sealer', None), Sealer):
        raise TypeError(f'{type(journal).__name__} is not a backend of this package: it has no encryption layer.')
    journal._sealer = Sealer(encryption, mode)  # type: ignore[attr-defined]
