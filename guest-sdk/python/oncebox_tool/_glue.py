"""What the build's entry module calls: the component's exports over the author's Tool subclass.

Not part of the API. The entry module (written by ``python -m oncebox_tool build``) is the app
module componentize-py wraps: it imports the author's module, calls :func:`export`, and defines
the ``Tool`` (and ``Reconcile``) classes componentize-py binds to the world's exports. It runs at
build time, so every check here is a build error, never a runtime one.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

from . import _json, _wit
from .errors import Permanent, ToolError
from .tool import NOT_COMMITTED, STILL_UNKNOWN, Committed, Tool

# class -> (world, the bindings' ReplayClass member, exports reconcile)
CLASSES = {
    "read-only": ("read-only-tool", "READ_ONLY", False),
    "idempotent-write": ("idempotent-tool", "IDEMPOTENT_WRITE", False),
    "compensatable": ("compensatable-tool", "COMPENSATABLE", True),
    "irreversible": ("irreversible-tool", "IRREVERSIBLE", True),
}


def normalize_class(name: str) -> str:
    """ "read_only", "Read-Only" -> "read-only"; unknown names are returned as they are."""
    key = str(name).strip().lower().replace("_", "-")
    return key if key in CLASSES else name


class BuildError(Exception):
    """A tool the build cannot export; raised while componentize-py imports the entry module."""


def find_tool(module) -> type:
    """The one Tool subclass defined in ``module`` (or, if it defines none, imported into it)."""
    every = [obj for obj in vars(module).values() if inspect.isclass(obj) and issubclass(obj, Tool) and obj is not Tool]
    found = [obj for obj in every if obj.__module__ == module.__name__] or every
    if len(found) != 1:
        names = ", ".join(sorted(c.__name__ for c in found)) or "none"
        raise BuildError(
            f"module `{module.__name__}` must define exactly one subclass of oncebox_tool.Tool (found: {names})"
        )
    return found[0]


def _pairs(value: Any, what: str) -> list:
    if hasattr(value, "items"):
        value = list(value.items())
    pairs = []
    for item in value or ():
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(s, str) for s in item)):
            raise BuildError(f"{what}: expected pairs of strings (or a dict of str to str), got {item!r}")
        pairs.append((item[0], item[1]))
    return pairs


def _strings(value: Any, what: str) -> list:
    if isinstance(value, str):
        raise BuildError(f"{what}: expected a list of strings, got the string {value!r}")
    items = list(value or ())
    if not all(isinstance(s, str) for s in items):
        raise BuildError(f"{what}: expected a list of strings, got {items!r}")
    return items


def _optional_string(value: Any, what: str):
    if value is not None and not isinstance(value, str):
        raise BuildError(f"{what}: expected a string or None, got {value!r}")
    return value


class Export:
    """The component's exports for one Tool subclass and one replay class."""

    def __init__(self, module_name: str, replay_class: str, version: str) -> None:
        replay_class = normalize_class(replay_class)
        if replay_class not in CLASSES:
            raise BuildError(f"unknown replay class {replay_class!r}; expected one of {', '.join(CLASSES)}")
        self.replay_class = replay_class
        self.world, self.member, self.reconciles = CLASSES[replay_class]
        _preload(self.reconciles, replay_class != "read-only")

        module = importlib.import_module(module_name)
        cls = find_tool(module)
        label = f"{module_name}.{cls.__name__}"
        self.cls = cls

        declared = getattr(cls, "replay_class", None)
        if declared is not None and normalize_class(declared) != replay_class:
            raise BuildError(
                f"{label}.replay_class is {declared!r} but [tool.oncebox] class is {replay_class!r}: make them agree"
            )
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise BuildError(f"{label}: set `name = \"...\"` (the tool's name, unique within a host)")
        description = getattr(cls, "description", None)
        if not isinstance(description, str) or not description:
            raise BuildError(f"{label}: set `description = \"...\"` (one sentence for the model and the operator)")
        if cls.invoke is Tool.invoke:
            raise BuildError(f"{label}: define `def invoke(self, args)`")
        has_reconcile = callable(getattr(cls, "reconcile", None))
        if self.reconciles and not has_reconcile:
            raise BuildError(
                f"{label}: a {replay_class} tool exports reconcile: define `def reconcile(self, effect_key, args)` "
                "returning Committed(output), NOT_COMMITTED or STILL_UNKNOWN (see oncebox_tool.lookup)"
            )
        if has_reconcile and not self.reconciles:
            raise BuildError(
                f"{label} defines reconcile, which a {replay_class} tool does not export (only compensatable and "
                "irreversible tools do): remove it, or change the class"
            )
        schema = getattr(cls, "args_schema", None)
        if not isinstance(schema, dict):
            raise BuildError(f"{label}.args_schema: expected a dict (a JSON Schema), got {schema!r}")
        try:
            schema_json = json.dumps(schema, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise BuildError(f"{label}.args_schema is not JSON: {e}") from None
        version = getattr(cls, "version", None) or version

        self.manifest_fields = dict(
            name=name,
            version=str(version),
            description=description,
            input_schema=schema_json,
            compensated_by=_optional_string(getattr(cls, "compensated_by", None), f"{label}.compensated_by"),
            compensation_args=_pairs(getattr(cls, "compensation_args", ()), f"{label}.compensation_args"),
            consequence=_optional_string(getattr(cls, "consequence", None), f"{label}.consequence"),
            sensitive=_strings(getattr(cls, "sensitive", ()), f"{label}.sensitive"),
        )
        self.describe()  # the manifest builds now, at build time, or the build fails

    def describe(self):
        types = _wit.types()
        return types.Manifest(class_=getattr(types.ReplayClass, self.member), **self.manifest_fields)

    def invoke(self, args: str) -> str:
        # The host validated the args against the schema already; JSON that does not parse means
        # the contract broke, which retrying cannot fix.
        try:
            parsed = json.loads(args)
        except ValueError as e:
            raise _wit.to_wit(Permanent(f"invalid args: {e}")) from None
        try:
            output = self.cls().invoke(parsed)
            return _json.dumps(output)
        except ToolError as e:
            raise _wit.to_wit(e) from None
        # Any other exception propagates: the component traps, and the traceback (on stderr)
        # reaches the host. It is a bug, not a tool-error.

    def reconcile(self, effect_key: str, args: str):
        answers = _wit.module("reconcile")
        try:
            parsed = json.loads(args)
        except ValueError:
            return answers.Reconciliation_StillUnknown()
        try:
            answer = self.cls().reconcile(effect_key, parsed)
        except ToolError:
            # A refused or failed lookup proves nothing.
            return answers.Reconciliation_StillUnknown()
        if isinstance(answer, Committed):
            try:
                return answers.Reconciliation_Committed(_json.dumps(answer.output))
            except ToolError:
                return answers.Reconciliation_StillUnknown()
        if answer is NOT_COMMITTED:
            return answers.Reconciliation_NotCommitted()
        if answer is STILL_UNKNOWN:
            return answers.Reconciliation_StillUnknown()
        raise TypeError(
            f"{self.cls.__name__}.reconcile returned {answer!r}: return Committed(output), NOT_COMMITTED or STILL_UNKNOWN"
        )


def _preload(reconciles: bool, effects: bool) -> None:
    """Imports, at build time, every binding module the world has: a component is a snapshot taken
    after the entry module's import, and a module first imported while a call runs finds no files."""
    names = ["types", "reads", "config"]
    if effects:
        names.append("effects")
    if reconciles:
        names.append("reconcile")
    importlib.import_module(_wit.RESULT_TYPES)
    for name in names:
        if _wit.module(name) is None:
            raise BuildError(f"the bindings have no {_wit.MODULES[name]}: is the world right?")
    if not effects and "wit_world.imports.effects" in sys.modules:  # pragma: no cover
        raise BuildError("a read-only tool's bindings import effects")
    _wit.preloaded = True


def export(module_name: str, replay_class: str, version: str) -> Export:
    return Export(module_name, replay_class, version)
