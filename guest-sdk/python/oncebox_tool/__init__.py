"""Write oncebox tools in plain Python.

A tool is a module with one subclass of :class:`Tool` (name, description, args schema, ``invoke``;
``reconcile`` too for compensatable and irreversible tools). Effects are plain functions
(:mod:`http`, :mod:`kv`, :mod:`outbox`, :func:`provider`); the host keys, records and
deduplicates each of them, so the tool itself never deals with idempotency. componentize-py and
its bindings stay behind this package: ``python -m oncebox_tool build`` makes the component.

The mistakes the SDK makes hard:

- **Only 200 is success.** A downstream that answers 201 has done the work. Use
  :meth:`Response.is_success` or :meth:`Response.json_if_success` (any 2xx).
- **Calling a lost answer a failure.** When the downstream's answer does not say whether the work
  was done, raise :class:`MayHaveCommitted`: the operation ends ``unknown`` and is reconciled,
  never ``failed`` (which promises that nothing took effect) and never resent blindly. The host
  already does this for an HTTP effect's 408, 409, 5xx or lost connection.
- **A key that changes between attempts.** An effect's key comes from the operation, its
  ``label`` and how often the attempt used the label: a label built from the time, a random
  number or a counter kept outside the args changes the key, and the downstream sees a new
  request. Labels are constants ("charge", "send-receipt").
"""

from . import http, kv, outbox
from ._calls import config, operation_key, provider
from ._json import pick
from .errors import MayHaveCommitted, Permanent, RateLimited, ToolError, Transient, UnknownOutcome
from .http import Response
from .tool import NOT_COMMITTED, STILL_UNKNOWN, Committed, Reconciliation, Tool, lookup

__version__ = "0.1.0"

__all__ = [
    "Committed",
    "MayHaveCommitted",
    "NOT_COMMITTED",
    "Permanent",
    "RateLimited",
    "Reconciliation",
    "Response",
    "STILL_UNKNOWN",
    "Tool",
    "ToolError",
    "Transient",
    "UnknownOutcome",
    "config",
    "http",
    "kv",
    "lookup",
    "operation_key",
    "outbox",
    "pick",
    "provider",
]
