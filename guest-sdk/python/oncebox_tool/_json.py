"""JSON in and out, with the SDK's rule: a body the tool cannot parse is the downstream breaking
the contract, a permanent error, not a blip."""

from __future__ import annotations

import json
from typing import Any

from .errors import Permanent


def dumps(value: Any) -> str:
    """Compact JSON, as the Rust SDK writes it (serde_json)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Permanent(f"invalid JSON: {e}") from None


def dump_bytes(value: Any) -> bytes:
    return dumps(value).encode("utf-8")


def loads(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise Permanent(f"invalid JSON: {e}") from None


def as_bytes(value: bytes | bytearray | memoryview | str, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes or str, not {type(value).__name__}")


def pick(value: Any, *names: str) -> dict:
    """The fields ``names`` of a JSON object, as a new dict in that order; other fields dropped.

    A value that is not an object, or lacks one of the fields, raises :class:`Permanent`, as the
    Rust SDK's typed output does (a body that does not match is the downstream breaking the
    contract). ``return pick(response.json_if_success(), "id", "status")`` records what the tool
    promises, not whatever else the downstream sent.
    """
    if not isinstance(value, dict):
        raise Permanent(f"invalid JSON: expected an object with {', '.join(names)}, got {type(value).__name__}")
    for name in names:
        if name not in value:
            raise Permanent(f"invalid JSON: missing field `{name}`")
    return {name: value[name] for name in names}
