"""Fingerprints of model requests and tool calls (the FP rules, PERF-1).

A journal entry is matched by position; its fingerprint says whether the recorded step was asked the
same thing as the live one. A digest therefore has to be identical in every process that asks the same
question (no hash-seed order, no `repr` of live objects, nothing that pydantic-ai regenerates per run)
and has to differ whenever the model or the tool would be asked something else. When neither can be
guaranteed the fingerprint is `None`, which the journal treats as "unverified".

Modules, bottom up: `_canonical` (canonical JSON), `_settings` (which settings count),
`_history` (the message history), `_request` (a model request from scratch),
`_digests` (tool calls, events, a run's start) and `_incremental` (the running hash, PERF-1).
"""

from ._digests import call_digest, fingerprint_event, fingerprint_run_start, fingerprint_tool_call, tool_call_digests
from ._history import Masker
from ._incremental import VERIFY_ENV_VAR, ModelFingerprinter, Renderings, RequestPreparer
from ._request import earlier_scheme_digest, fingerprint_model_request
from ._settings import TRANSPORT_ONLY_SETTINGS

__all__ = (
    'TRANSPORT_ONLY_SETTINGS',
    'VERIFY_ENV_VAR',
    'Masker',
    'ModelFingerprinter',
    'Renderings',
    'RequestPreparer',
    'call_digest',
    'earlier_scheme_digest',
    'fingerprint_event',
    'fingerprint_model_request',
    'fingerprint_run_start',
    'fingerprint_tool_call',
    'tool_call_digests',
)
