"""The bindings componentize-py generates (``wit_world``), reached lazily.

Nothing here imports ``wit_world`` at module level: a read-only tool's world has no ``effects``
interface, and the SDK must import the same way in every world (and on the build machine, where
there are no bindings at all). The build's entry module imports, at build time, every binding
module its world has; a component is a snapshot taken after that import, and a module first
imported while a call runs finds no files in the sandbox. So the lookups below only read
``sys.modules``.
"""

from __future__ import annotations

import sys

from .errors import MayHaveCommitted, Permanent, RateLimited, ToolError, Transient

# Every binding module a world can have; `effects` and `reconcile` only in the worlds that have them.
MODULES = {
    "types": "wit_world.imports.types",
    "reads": "wit_world.imports.reads",
    "config": "wit_world.imports.config",
    "effects": "wit_world.imports.effects",
    "reconcile": "wit_world.exports.reconcile",
}
RESULT_TYPES = "componentize_py_types"

# Set by the entry module once it imported its world's bindings (at build time): from then on a
# binding module not in sys.modules is one the world does not have, and is not looked for on a
# filesystem the sandbox does not have.
preloaded = False


def module(name: str):
    """A binding module, or None where the world does not have it."""
    full = MODULES[name]
    found = sys.modules.get(full)
    if found is None:
        if preloaded:
            return None
        # At build time (the entry module preloading) or outside a component (tests with fakes).
        import importlib

        try:
            found = importlib.import_module(full)
        except ImportError:
            return None
    return found


def effects(what: str):
    """The `effects` bindings, or a clear error for a tool whose world cannot make effects."""
    found = module("effects")
    if found is None:
        # Nothing can have taken effect, and no retry can change that: permanent, as in the JS SDK.
        from .errors import Permanent

        raise Permanent(
            f"{what} is an effect, and this tool's world (read-only-tool) cannot make effects: "
            "declare class = \"idempotent-write\" (or compensatable, irreversible) under "
            "[tool.oncebox] in pyproject.toml, or use a read (http.get, kv.get)"
        )
    return found


def reads():
    return _required("reads")


def config():
    return _required("config")


def types():
    return _required("types")


def _required(name: str):
    found = module(name)
    if found is None:
        raise RuntimeError(
            f"oncebox_tool: the bindings ({MODULES[name]}) are missing: build the tool with "
            "`python -m oncebox_tool build`"
        )
    return found


def _err_class():
    found = sys.modules.get(RESULT_TYPES)
    if found is None:
        import importlib

        found = importlib.import_module(RESULT_TYPES)
    return found.Err


def call(function, *args):
    """Calls an import, turning the contract's `tool-error` into the SDK's exceptions."""
    err = _err_class()
    try:
        return function(*args)
    except err as e:
        raise from_wit(e.value) from None


def from_wit(value) -> ToolError:
    """The SDK's exception for a `tool-error` value of the bindings."""
    kind = type(value).__name__
    if kind == "ToolError_Transient":
        return Transient(value.value)
    if kind == "ToolError_RateLimited":
        return RateLimited(value.value.retry_after_ms, value.value.message)
    if kind == "ToolError_Permanent":
        return Permanent(value.value)
    if kind == "ToolError_UnknownOutcome":
        return MayHaveCommitted(value.value)
    return Permanent(f"unknown tool-error from the host: {value!r}")


def to_wit(error: ToolError):
    """The `componentize_py_types.Err` carrying the `tool-error` for an SDK exception."""
    t = types()
    if isinstance(error, RateLimited):
        value = t.ToolError_RateLimited(t.RateLimit(retry_after_ms=max(0, error.retry_after_ms), message=error.message))
    elif isinstance(error, Transient):
        value = t.ToolError_Transient(error.message)
    elif isinstance(error, MayHaveCommitted):
        value = t.ToolError_UnknownOutcome(error.message)
    else:
        value = t.ToolError_Permanent(error.message)
    return _err_class()(value)
