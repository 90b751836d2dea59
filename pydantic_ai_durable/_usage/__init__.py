"""Usage: what a run spends, what a replay must not count, and the arithmetic both share.

`_ledger` keeps replayed steps out of the run's usage and credits them before pydantic-ai's limit checks
(U-rules); `_spend` is the live spend journaled over all attempts (U2, UW); `_arithmetic` adds, subtracts
and prices pydantic-ai's usage objects for both.
"""

from ._arithmetic import is_successful_tool_payload as is_successful_tool_payload
from ._ledger import ReplayUsageLedger as ReplayUsageLedger
from ._spend import NestedUsage as NestedUsage
from ._spend import RunSpend as RunSpend
from ._spend import without_operation_usage as without_operation_usage
