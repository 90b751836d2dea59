"""Steps: what carries out each journaled step of an agent run, and what they share.

The executors: `_backend` (every durable operation pydantic-ai routes), `_leaf` (leaf toolsets
pydantic-ai does not journal), `_output` (output functions), `_discovery` (tool listings verified by
listing again); what they share: `_runner` (replay or run live and record, the rules of X and W once),
`_payloads` (the recorded form of tool outcomes), `_codec` (pydantic-ai's payload codec, with the
decoded replay passed through) and `_warm` (encoders built before the first request); `_waiting` notes the
calls a run ends waiting on and hands it the recorded decisions (WT-1, WT-3).
"""

from ._backend import DurableBackend as DurableBackend
from ._codec import PAYLOAD_CODEC as PAYLOAD_CODEC
from ._codec import not_journalable as not_journalable
from ._leaf import DurableLeafToolset as DurableLeafToolset
from ._opt_out import opted_out_toolsets as opted_out_toolsets
from ._output import journal_output_process as journal_output_process
from ._waiting import check_wait_timeout as check_wait_timeout
from ._waiting import note_run_end as note_run_end
from ._waiting import recorded_decisions as recorded_decisions
