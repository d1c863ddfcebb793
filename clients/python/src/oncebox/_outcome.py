"""Typed outcomes of a call and the client's errors.

An outcome is what the server answered for a step (a failed tool is an outcome too, answered 200);
an error is a request the server refused (a 4xx) or an answer that never arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union


class OnceboxError(Exception):
    """The base of every error this package raises."""


class RequestError(OnceboxError):
    """The server refused the request (a 4xx): nothing was recorded or sent. Fix it; do not resend it.

    ``status_code`` is the HTTP status, ``kind`` and ``message`` the server's ``{"error": {...}}``.
    """

    def __init__(self, status_code: int, kind: str, message: str, method: str, path: str) -> None:
        self.status_code = status_code
        self.kind = kind
        self.message = message
        super().__init__(f"{method} {path}: {status_code} {kind}: {message}")


class AnswerLost(OnceboxError):
    """Every try's answer was lost (timeouts, resets, 5xx) within the client's bound.

    The call may have run. Send it again later with the SAME ``run_id`` and ``step_id`` (the ledger
    answers it), never as a new step.
    """


class StepConflict(OnceboxError):
    """The step was recorded with other args: nothing was sent. Resolve the original operation, or
    name a new step for a new intent."""

    def __init__(self, outcome: "Conflict") -> None:
        self.outcome = outcome
        super().__init__(
            f"step {outcome.run_id}/{outcome.step_id} was recorded with other args; nothing was sent: "
            f"{outcome.message}"
        )


class OutcomeUnknown(OnceboxError):
    """The step's effect may have happened: reconcile the run (``client.reconcile(run_id)``) or have
    a person settle it. Never call it again as a new step."""

    def __init__(self, outcome: "Unknown") -> None:
        self.outcome = outcome
        super().__init__(outcome.what_to_do)


class StepFailed(OnceboxError):
    """The tool failed and nothing of it took effect (or a person rejected it, or its record expired)."""

    def __init__(self, outcome: "Outcome") -> None:
        self.outcome = outcome
        super().__init__(f"step {outcome.run_id}/{outcome.step_id} ({outcome.tool}): {outcome.status}: {outcome.message}")


class StillAwaitingApproval(OnceboxError):
    """The step still awaits a person's approval after the caller was resumed."""

    def __init__(self, outcome: "AwaitingApproval") -> None:
        self.outcome = outcome
        super().__init__(
            f"step {outcome.run_id}/{outcome.step_id} ({outcome.tool}) still awaits approval of "
            f"{outcome.operation_key}"
        )


@dataclass(frozen=True)
class Outcome:
    """What the server answered for one step. ``status`` is the API's status string."""

    status: str
    run_id: str
    step_id: str
    tool: str
    replayed: bool
    attempts: int
    operation_key: Optional[str]
    output: Any = None
    error: Optional[Mapping[str, Any]] = None
    source: Optional[str] = None
    """``oncebox-source``: ``fresh``, ``deduplicated`` or ``replayed``."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def message(self) -> str:
        """The error's message, or ``""``."""
        return str((self.error or {}).get("message", ""))

    @property
    def ok(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True)
class Completed(Outcome):
    """The step's effect took place once; ``output`` is its result (``replayed`` when from the ledger)."""


@dataclass(frozen=True)
class Failed(Outcome):
    """The tool failed and nothing of the operation took effect; ``error`` says why."""


@dataclass(frozen=True)
class Unknown(Outcome):
    """The effect may have happened (its answer was lost). Reconcile; never send it as a new step."""

    @property
    def what_to_do(self) -> str:
        return (
            f"step {self.run_id}/{self.step_id} ({self.tool}) is unknown: its effect may have happened. "
            f"Reconcile the run (POST /v1/runs/{self.run_id}/reconcile, client.reconcile({self.run_id!r})) "
            f"or have a person settle {self.operation_key}; do not call it again as a new step. {self.message}"
        )


@dataclass(frozen=True)
class AwaitingApproval(Outcome):
    """An irreversible step waits for a person; nothing was sent. ``approval`` is what they see."""

    @property
    def approval(self) -> Mapping[str, Any]:
        return self.raw.get("approval") or {}

    @property
    def fingerprint(self) -> Optional[str]:
        return self.raw.get("fingerprint")

    @property
    def params(self) -> Any:
        """The params the person approves (sensitive values masked here)."""
        return self.approval.get("params")

    @property
    def consequence(self) -> Optional[str]:
        return self.approval.get("consequence")


@dataclass(frozen=True)
class InProgress(Outcome):
    """Another caller holds the step right now: nothing failed. Call again with the same ids."""


@dataclass(frozen=True)
class Conflict(Outcome):
    """The step was recorded with other args; nothing was sent."""


@dataclass(frozen=True)
class Rejected(Outcome):
    """A person refused these params; nothing was or will be sent for this step."""


@dataclass(frozen=True)
class Expired(Outcome):
    """The step's record expired; it was not run as new. A new intent needs a new step id."""


AnyOutcome = Union[Completed, Failed, Unknown, AwaitingApproval, InProgress, Conflict, Rejected, Expired]

_KINDS = {
    "completed": Completed,
    "failed": Failed,
    "unknown": Unknown,
    "awaiting-approval": AwaitingApproval,
    "in-progress": InProgress,
    "conflict": Conflict,
    "rejected": Rejected,
    "expired": Expired,
}


def outcome_of(body: Mapping[str, Any], run_id: str, step_id: str, tool: str, source: Optional[str]) -> AnyOutcome:
    """The typed outcome of a ``POST /v1/calls`` answer."""
    status = body.get("status")
    kind = _KINDS.get(status) if isinstance(status, str) else None
    if kind is None:
        raise OnceboxError(f"the server answered a status this client does not know: {status!r}")
    return kind(  # type: ignore[return-value]
        status=status,
        run_id=run_id,
        step_id=step_id,
        tool=tool,
        replayed=bool(body.get("replayed", False)),
        attempts=int(body.get("attempts", 0)),
        operation_key=body.get("operation_key"),
        output=body.get("output"),
        error=body.get("error"),
        source=source,
        raw=body,
    )


def settled(outcome: AnyOutcome) -> AnyOutcome:
    """``outcome`` if it completed; else the error a framework's step should raise."""
    if isinstance(outcome, Completed):
        return outcome
    if isinstance(outcome, Conflict):
        raise StepConflict(outcome)
    if isinstance(outcome, Unknown):
        raise OutcomeUnknown(outcome)
    if isinstance(outcome, (Failed, Rejected, Expired)):
        raise StepFailed(outcome)
    return outcome
