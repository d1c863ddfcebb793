"""oncebox: call tools of ``oncebox serve`` whose side effects happen once.

>>> client = oncebox.Client("http://127.0.0.1:7420")
>>> outcome = client.call("charge", {...}, run_id="order-o-1", step_id="0-charge")

The run and step ids come from the caller's durable state (``oncebox.langgraph`` and
``oncebox.dbos`` take them from the framework), never from the model. See ``docs/integrations.md``.
"""

from ._client import DEFAULT_RETRIES, FIRST_BACKOFF, MAX_BACKOFF, AsyncClient, Client
from ._outcome import (
    AnswerLost,
    AnyOutcome,
    AwaitingApproval,
    Completed,
    Conflict,
    Expired,
    Failed,
    InProgress,
    OnceboxError,
    Outcome,
    OutcomeUnknown,
    Rejected,
    RequestError,
    StepConflict,
    StepFailed,
    StillAwaitingApproval,
    Unknown,
)

__all__ = [
    "AnswerLost",
    "AnyOutcome",
    "AsyncClient",
    "AwaitingApproval",
    "Client",
    "Completed",
    "Conflict",
    "DEFAULT_RETRIES",
    "Expired",
    "FIRST_BACKOFF",
    "Failed",
    "InProgress",
    "MAX_BACKOFF",
    "OnceboxError",
    "Outcome",
    "OutcomeUnknown",
    "Rejected",
    "RequestError",
    "StepConflict",
    "StepFailed",
    "StillAwaitingApproval",
    "Unknown",
]
