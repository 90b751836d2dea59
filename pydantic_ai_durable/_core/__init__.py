"""The framework-neutral journal core: attempts, runs, steps, matching, divergence and failure fences.

It knows positions, names, kinds, fingerprints and JSON payloads, and nothing of pydantic-ai, so every replay
rule of docs/rules.md (R, P, M, D, W, F, X, C and S) lives here once and is tested without an agent. Its
modules, bottom up: `_records` (stored shapes), `_stats`, `_lease`, `_attempt_view` (the attempt as its runs
see it), `_step`, `_pool` (argument matching), `_fences` (failure fences), `_run_writes` (every write of
a run), `_run` (what it reads and decides), `_retention` and `_attempt`; beside them, for job queues, `_sweep`
(hands interrupted executions back) and `_retry` (when a task that met a busy, lost or failing journal runs
again), and `_rekey` (rewrites every value under the current encryption key); `_document` (an export's
text read one value at a time), `_export`, `_import`, `_transfer` (executions moved between journals, or
forked) and `_conversation` (a run read back as messages); `_waiting` (the calls an attempt's runs deferred)
and `_resolve` (deciding them from anywhere, and deadlines), with `_times` (stored times as text, even one beyond
the calendar); `_events` (waits on external events: resume tokens, resolved by token alone). The rest of the
package imports the names below
from here.
"""

from ._attempt import Attempt, CleanupMode
from ._cancel import cancel_execution, cancel_request, cancellation
from ._conversation import recorded_conversation
from ._events import (
    EventWait,
    event_slot,
    make_token,
    new_secret,
    note_event,
    resolve_event,
    settle_overdue,
)
from ._export import EXPORT_FORMAT, EXPORT_VERSION, Limits, parse_document, snapshot_from_document
from ._fences import RunMeta
from ._import import ImportReport, write_snapshot
from ._provider_waits import note_provider_wait, provider_job, provider_jobs
from ._records import ENTRY_VERSION, MODEL_ERROR, Kind, latest_spend, missing_links, parse_entry, run_order, spend_cost
from ._rekey import RekeyReport, rekey
from ._resolve import (
    Resolution,
    call_json,
    deny_overdue,
    describe,
    pending_calls,
    resolve_calls,
    secret_digest,
    set_dispatcher,
)
from ._retention import FROM_JOURNAL, METADATA_LIMIT, check_metadata, check_same_work
from ._retry import retry_delay
from ._run import DivergenceMode, Run, check_divergence_mode
from ._stats import Divergence, Stats, StepOutcome
from ._step import STEP_OBSERVER, SimulatedCrash, Step, StepPoint, current_step
from ._sweep import DISPATCHED, sweep_interrupted
from ._timer_waits import note_timer_wait
from ._transfer import copy_execution, export_execution, fork_execution, import_execution
from ._waiting import Deferral, decided_at, decisions_for, note_answered, note_deferred, still_waiting

__all__ = (
    'DISPATCHED',
    'ENTRY_VERSION',
    'EXPORT_FORMAT',
    'EXPORT_VERSION',
    'FROM_JOURNAL',
    'METADATA_LIMIT',
    'MODEL_ERROR',
    'STEP_OBSERVER',
    'Attempt',
    'CleanupMode',
    'Deferral',
    'Divergence',
    'DivergenceMode',
    'EventWait',
    'ImportReport',
    'Kind',
    'Limits',
    'RekeyReport',
    'Resolution',
    'Run',
    'RunMeta',
    'SimulatedCrash',
    'Stats',
    'Step',
    'StepOutcome',
    'StepPoint',
    'call_json',
    'cancel_execution',
    'cancel_request',
    'cancellation',
    'check_divergence_mode',
    'check_metadata',
    'check_same_work',
    'copy_execution',
    'current_step',
    'decided_at',
    'decisions_for',
    'deny_overdue',
    'describe',
    'event_slot',
    'export_execution',
    'fork_execution',
    'import_execution',
    'latest_spend',
    'make_token',
    'missing_links',
    'new_secret',
    'note_answered',
    'note_deferred',
    'note_event',
    'note_provider_wait',
    'note_timer_wait',
    'parse_document',
    'parse_entry',
    'pending_calls',
    'provider_job',
    'provider_jobs',
    'recorded_conversation',
    'rekey',
    'resolve_calls',
    'resolve_event',
    'retry_delay',
    'run_order',
    'secret_digest',
    'set_dispatcher',
    'settle_overdue',
    'snapshot_from_document',
    'spend_cost',
    'still_waiting',
    'sweep_interrupted',
    'write_snapshot',
)
