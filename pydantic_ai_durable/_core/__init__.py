"""The framework-neutral journal core: attempts, runs, steps, matching, divergence and failure fences.

It knows positions, names, kinds, fingerprints and JSON payloads, and nothing of pydantic-ai, so every replay
rule of docs/rules.md (R, P, M, D, W, F, X, C and S) lives here once and is tested without an agent. Its
modules, bottom up: `_records` (stored shapes), `_stats`, `_lease`, `_attempt_view` (the attempt as its runs
see it), `_step`, `_pool` (argument matching, DV-2), `_fences` (failure fences), `_run_writes` (every write of
a run), `_run` (what it reads and decides), `_retention` and `_attempt`; beside them, for job queues, `_sweep`
(hands interrupted executions back) and `_retry` (when a task that met a busy, lost or failing journal runs
again), and `_rekey` (rewrites every value under the current encryption key); `_export`, `_import`,
`_transfer` (executions moved between journals, or forked) and `_conversation` (a run read back as messages).
The rest of the package imports the names below from here.
"""

from ._attempt import Attempt, CleanupMode
from ._conversation import recorded_conversation
from ._export import EXPORT_FORMAT, EXPORT_VERSION, Limits
from ._fences import RunMeta
from ._import import ImportReport
from ._records import ENTRY_VERSION, Kind, latest_spend, parse_entry
from ._rekey import RekeyReport, rekey
from ._retention import FROM_JOURNAL, METADATA_LIMIT, check_metadata, check_same_work
from ._retry import retry_delay
from ._run import DivergenceMode, Run, check_divergence_mode
from ._stats import Divergence, Stats, StepOutcome
from ._step import STEP_OBSERVER, SimulatedCrash, Step, StepPoint, current_step
from ._sweep import DISPATCHED, sweep_interrupted
from ._transfer import copy_execution, export_execution, fork_execution, import_execution

__all__ = (
    'DISPATCHED',
    'ENTRY_VERSION',
    'EXPORT_FORMAT',
    'EXPORT_VERSION',
    'FROM_JOURNAL',
    'METADATA_LIMIT',
    'STEP_OBSERVER',
    'Attempt',
    'CleanupMode',
    'Divergence',
    'DivergenceMode',
    'ImportReport',
    'Kind',
    'Limits',
    'RekeyReport',
    'Run',
    'RunMeta',
    'SimulatedCrash',
    'Stats',
    'Step',
    'StepOutcome',
    'StepPoint',
    'check_divergence_mode',
    'check_metadata',
    'check_same_work',
    'copy_execution',
    'current_step',
    'export_execution',
    'fork_execution',
    'import_execution',
    'latest_spend',
    'parse_entry',
    'recorded_conversation',
    'rekey',
    'retry_delay',
    'sweep_interrupted',
)
