"""Durable key-value state.

The module-level functions use the tool's own namespace (named after the tool); :func:`namespace`
reaches another, which the operator must grant (``kv = ["name"]`` under ``[tools.NAME.grants]``).
Writes are effects (they take a constant ``label``): they commit in the same transaction as their
record, and only if the attempt completes (a failed attempt's writes are discarded). Reads are not.

Reads return a :class:`Version`, and :meth:`Namespace.set_if` writes only if the key still has
it: a read-modify-write of a key that other steps write too (a counter, a stock level) must use
it, or two steps that read the same value both write their sum and one update is lost.
:meth:`Namespace.update_json` does the whole loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from . import _json, _wit
from .errors import Transient

#: How often :meth:`Namespace.update_json` reads again after another write came first.
UPDATE_TRIES = 16


@dataclass(frozen=True)
class Version:
    """A key's version: it changes with every committed write of the key. Opaque: compare it,
    never order it. :data:`Version.ABSENT` is the version of a key that does not exist:
    ``set_if(..., Version.ABSENT)`` creates a key only if nobody else has."""

    value: int


Version.ABSENT = Version(0)  # type: ignore[attr-defined]


class Namespace:
    """A KV namespace: the tool's own (``name`` None), or one granted to it."""

    __slots__ = ("name",)

    def __init__(self, name: Optional[str] = None) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"kv.namespace({self.name!r})" if self.name is not None else "kv (own namespace)"

    # Reads.

    def get(self, key: str) -> Optional[bytes]:
        """The value, or None."""
        return self.get_versioned(key)[0]

    def get_versioned(self, key: str) -> Tuple[Optional[bytes], Version]:
        """The value and its version (:data:`Version.ABSENT` when there is none)."""
        entry = _wit.call(_wit.reads().kv_get, self.name, key)
        if entry is None:
            return None, Version.ABSENT
        return bytes(entry.value), Version(entry.version)

    def get_json(self, key: str) -> Any:
        """Reads a JSON value (None when absent); a value that does not parse raises Permanent."""
        return self.get_json_versioned(key)[0]

    def get_json_versioned(self, key: str) -> Tuple[Any, Version]:
        data, version = self.get_versioned(key)
        return (None if data is None else _json.loads(data)), version

    # Writes: effects.

    def set(self, label: str, key: str, value: bytes | str) -> None:
        effects = _wit.effects(f"kv.set({label!r})")
        _wit.call(effects.kv_set, label, self.name, key, _json.as_bytes(value, "the value"))

    def set_json(self, label: str, key: str, value: Any) -> None:
        self.set(label, key, _json.dump_bytes(value))

    def set_if(self, label: str, key: str, value: bytes | str, version: Version) -> bool:
        """Writes ``value`` only if the key still has ``version``. False: another write came first
        and nothing was written: read again and decide again."""
        if not isinstance(version, Version):
            raise TypeError("set_if takes the Version a read returned (or Version.ABSENT)")
        effects = _wit.effects(f"kv.set_if({label!r})")
        return bool(
            _wit.call(effects.kv_set_if, label, self.name, key, _json.as_bytes(value, "the value"), version.value)
        )

    def set_json_if(self, label: str, key: str, value: Any, version: Version) -> bool:
        return self.set_if(label, key, _json.dump_bytes(value), version)

    def update_json(self, label: str, key: str, update: Callable[[Any], Any]) -> Any:
        """Read-modify-write without lost updates: reads the key, computes its new value with
        ``update`` (given the current one, or None), and writes it only if nobody wrote the key
        in between, reading again if somebody did. Returns the value written."""
        for _ in range(UPDATE_TRIES):
            current, version = self.get_json_versioned(key)
            new = update(current)
            if self.set_json_if(label, key, new, version):
                return new
        raise Transient(f"kv: `{key}` kept changing under concurrent writes")

    def delete(self, label: str, key: str) -> None:
        effects = _wit.effects(f"kv.delete({label!r})")
        _wit.call(effects.kv_delete, label, self.name, key)


def namespace(name: str) -> Namespace:
    """Another namespace, shared with the tools it is granted to."""
    return Namespace(name)


_OWN = Namespace(None)

get = _OWN.get
get_versioned = _OWN.get_versioned
get_json = _OWN.get_json
get_json_versioned = _OWN.get_json_versioned
set = _OWN.set  # noqa: A001 (the module's API mirrors the Rust SDK's kv::set)
set_json = _OWN.set_json
set_if = _OWN.set_if
set_json_if = _OWN.set_json_if
update_json = _OWN.update_json
delete = _OWN.delete
