"""What a tool author writes: a subclass of :class:`Tool`, and for compensatable and irreversible
tools a ``reconcile`` method answering with a :class:`Reconciliation`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, Tuple, Union

from . import http
from .errors import ToolError


class Tool:
    """A tool: JSON args in, JSON-able output out.

    Subclass it once in the tool's module and set the class attributes; ``python -m oncebox_tool
    build`` finds the subclass and exports it as a component of the world of the class named in
    ``[tool.oncebox]``::

        class Charge(Tool):
            name = "charge-py"
            description = "Charges an order's payment method once."
            replay_class = "compensatable"
            args_schema = {...}

            def invoke(self, args):
                ...

            def reconcile(self, effect_key, args):
                return lookup(f"{base}/payments/by-key/{effect_key}")

    ``invoke`` runs once per attempt, on a fresh instance. Effects go through :mod:`~oncebox_tool.http`,
    :mod:`~oncebox_tool.kv`, :mod:`~oncebox_tool.outbox` and :func:`~oncebox_tool.provider`; the
    host keys and records each of them. Raise :class:`~oncebox_tool.Permanent` (and the other
    :mod:`~oncebox_tool.errors`) to fail; any other exception traps, and the host shows its
    traceback.
    """

    #: The tool's name, unique within a host.
    name: ClassVar[str]
    #: One sentence for the model and the operator.
    description: ClassVar[str]
    #: "read-only", "idempotent-write", "compensatable" or "irreversible". Optional; when set it
    #: must be the class in ``[tool.oncebox]`` (which picks the component's world).
    replay_class: ClassVar[Optional[str]] = None
    #: The manifest's version; by default the ``version`` of the tool's ``pyproject.toml``.
    version: ClassVar[Optional[str]] = None
    #: The JSON Schema the args must satisfy. The host validates args against it before anything
    #: is recorded: say ``"additionalProperties": False`` and list ``required``.
    args_schema: ClassVar[Mapping[str, Any]] = {"type": "object"}
    #: The tool that undoes this one (compensatable tools).
    compensated_by: ClassVar[Optional[str]] = None
    #: How the ``compensated_by`` tool's args are made from this operation's: its arg name to a
    #: JSON pointer into ``{"args": ..., "output": ...}`` (a dict, or pairs). For ``charge``
    #: undone by ``refund``: ``{"order_id": "/args/order_id", "amount_cents":
    #: "/output/amount_cents"}``. The host builds them when it compensates. Pointers may not
    #: reach a ``sensitive`` arg: the ledger keeps those redacted.
    compensation_args: ClassVar[Union[Mapping[str, str], Sequence[Tuple[str, str]]]] = ()
    #: For irreversible tools: what running it does that cannot be taken back, in words, shown to
    #: the person asked to approve a call ("The shipment leaves the warehouse and cannot be
    #: cancelled").
    consequence: ClassVar[Optional[str]] = None
    #: JSON pointers into the args whose values never appear in logs or records (``/payment_method``).
    sensitive: ClassVar[Sequence[str]] = ()

    def invoke(self, args: dict) -> Any:
        """Runs the tool once; returns the output (anything ``json.dumps`` takes)."""
        raise NotImplementedError(f"{type(self).__name__} must define invoke(self, args)")

    # Compensatable and irreversible tools also define:
    #
    #     def reconcile(self, effect_key: str, args: dict) -> Reconciliation
    #
    # called by the host for an operation whose outcome is unknown, once per effect in doubt.
    # - `effect_key` is exactly the `Idempotency-Key` header the host sent with that effect (for
    #   a provider effect, the key the provider was given): look the effect up by it.
    # - The lookup runs with the tool's own grants: an HTTP lookup is a read (`http.get`), and its
    #   URL's origin must be granted under `[tools.NAME.grants] http`, like the tool's effects. A
    #   lookup it may not make fails, and the effect stays in doubt.
    # - It runs outside any operation, so an effect it tries is refused: its answer is evidence,
    #   not an action. A ToolError raised in it (a refused read, say) answers STILL_UNKNOWN.


@dataclass(frozen=True)
class Committed:
    """The effect took place; ``output`` is what ``invoke`` would have returned."""

    output: Any


class _Answer:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self):  # the singletons stay singletons
        return self._name


#: The authority has no record of the effect (yet). Only "no record of it *now*": a downstream
#: still processing the request, or one whose index lags, shows nothing for a charge that will
#: commit. The host counts it as proof that the effect did not happen only once the downstream's
#: ``settle_window`` (the operator's setting per host, 5 minutes by default) has passed since the
#: effect's last send ended; before that the operation stays unknown.
NOT_COMMITTED = _Answer("NOT_COMMITTED")

#: The authority cannot tell. Not proof of anything.
STILL_UNKNOWN = _Answer("STILL_UNKNOWN")


def lookup(url: str, output: Optional[Callable[[Any], Any]] = None) -> "Reconciliation":
    """Asks an authority that looks effects up by their key (as Stripe-like APIs do).

    200 with a JSON body is :class:`Committed` with that body as the output (passed through
    ``output`` first, if given: ``output=lambda body: pick(body, "id", "status")``); 404 is "no
    record of it now", :data:`NOT_COMMITTED`, which the host counts as not committed only after
    the downstream's settle window; anything else (an error, a 5xx, a body that does not parse or
    that ``output`` refuses with a ToolError) proves nothing: :data:`STILL_UNKNOWN`. The lookup is
    a read: its URL's origin must be granted to the tool like its effects'
    (``[tools.NAME.grants] http``).
    """
    try:
        response = http.get(url)
        if response.status == 200:
            body = response.json()
            return Committed(body if output is None else output(body))
    except ToolError:
        return STILL_UNKNOWN
    if response.status == 404:
        return NOT_COMMITTED
    return STILL_UNKNOWN


class Reconciliation:
    """What the authority says about an effect whose response was lost: :class:`Committed`,
    :data:`NOT_COMMITTED` or :data:`STILL_UNKNOWN` (also reachable as attributes of this class,
    with :meth:`lookup`, to read like the Rust SDK's ``Reconciliation::lookup``).

    The tool reports what the authority shows; the host decides what it proves.
    """

    Committed = Committed
    NOT_COMMITTED = NOT_COMMITTED
    STILL_UNKNOWN = STILL_UNKNOWN
    lookup = staticmethod(lookup)

    def __init__(self) -> None:  # pragma: no cover
        raise TypeError("return Committed(output), NOT_COMMITTED or STILL_UNKNOWN")
