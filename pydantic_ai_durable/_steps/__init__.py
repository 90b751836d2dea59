"""Steps: what carries out each journaled step of an agent run.

Every step goes through one pipeline, `_pipeline.run_step` (claim, replay or run live, record), and a
`StepKind` says what its kind does its own way: `_model` (model requests), `_tool` (tool calls pydantic-ai
routes), `_operation` (events, capability operations, operations of later releases), `_discovery` (tool
listings verified by listing again), `_leaf` (leaf toolsets pydantic-ai does not journal) and `_output`
(output functions). Where steps come from: `_backend` (every durable operation pydantic-ai routes), the
leaf toolset wrapper in `_leaf`, and output processing in `_output`. Beside them: `_payloads` (the recorded
form of tool outcomes), `_codec` (pydantic-ai's payload codec, with the decoded replay passed through),
`_opt_out` (tools that never replay), `_warm` (encoders built before the first request) and `_model_errors`
(a failed model request's error as its recorded outcome, A-16); `_waiting` notes the calls a run ends waiting
on and hands it the recorded decisions, `_external_events` journals waits on external events (resume tokens);
`_timer` journals the agent graph's waits as wake-up times (TM-1, A-17), and `_pending` checks again on a
replayed pending response.
"""

from ._backend import DurableBackend as DurableBackend
from ._codec import PAYLOAD_CODEC as PAYLOAD_CODEC
from ._codec import not_journalable as not_journalable
from ._external_events import waits_on_events as waits_on_events
from ._leaf import DurableLeafToolset as DurableLeafToolset
from ._model_errors import MODEL_ERRORS_RECORDED as MODEL_ERRORS_RECORDED
from ._opt_out import opted_out_toolsets as opted_out_toolsets
from ._output import journal_output_process as journal_output_process
from ._pending import refuse_other_start as refuse_other_start
from ._pipeline import StepKind as StepKind
from ._pipeline import run_step as run_step
from ._timer import durable_wait as durable_wait
from ._timer import noting_cancellation as noting_cancellation
from ._waiting import check_wait_timeout as check_wait_timeout
from ._waiting import note_run_end as note_run_end
from ._waiting import recorded_decisions as recorded_decisions
