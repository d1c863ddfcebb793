"""How an invocation or an effect failed, as exceptions.

An effect or a read that the host refuses raises one of these; raising one from ``invoke`` ends
the call with the matching ``tool-error``. The class decides what the host does next:

- :class:`Transient`: nothing took effect; another attempt may succeed.
- :class:`RateLimited`: nothing took effect; try again after ``retry_after_ms``.
- :class:`Permanent`: invalid input, a rejected payment, a business rule: never retried.
- :class:`MayHaveCommitted` (the contract's ``unknown-outcome``): an effect may have committed
  but its answer does not say so. The operation ends ``unknown`` and is reconciled, never
  ``failed`` (which promises that nothing took effect) and never resent blindly.

Any other exception is a bug: it is not caught, the component traps, and the host shows the
traceback (printed to stderr) in the failure.
"""

from __future__ import annotations


class ToolError(Exception):
    """The base of the four classes of failure the contract knows."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = str(message)


class Transient(ToolError):
    """Nothing took effect; another attempt may succeed."""


class Permanent(ToolError):
    """Invalid input, a rejected payment, a missing permission, a business rule: never retried."""


class RateLimited(ToolError):
    """Nothing took effect; the downstream asked to wait ``retry_after_ms`` milliseconds."""

    def __init__(self, retry_after_ms: int, message: str) -> None:
        super().__init__(message)
        self.retry_after_ms = int(retry_after_ms)

    def __str__(self) -> str:
        return f"{self.message} (retry after {self.retry_after_ms} ms)"


class MayHaveCommitted(ToolError):
    """The downstream's answer does not say whether the work was done.

    A provider's 5xx, a ``"status": "pending"`` that never settles, a body cut short: the
    operation ends ``unknown`` and is reconciled through the tool's ``reconcile``, never retried
    blindly and never recorded as ``failed``. This is the contract's ``unknown-outcome``, named
    for the case a tool author meets. (The host already treats 408, 409 and 5xx answers to HTTP
    effects, and a lost connection, this way before the tool sees them.)
    """


#: The contract's name for :class:`MayHaveCommitted`.
UnknownOutcome = MayHaveCommitted
