"""The remaining imports as plain functions."""

from __future__ import annotations

from typing import Any, Optional

from . import _json, _wit


def provider(label: str, name: str, request: Any) -> Any:
    """An effect: calls an effect provider the embedder registered under ``name`` (and the
    operator granted to the tool), with JSON in and out."""
    effects = _wit.effects(f"provider({label!r}, {name!r})")
    return _json.loads(_wit.call(effects.provider, label, name, _json.dumps(request)))


def operation_key() -> str:
    """The key the host derived for this operation (for tools that must put it in a body or a
    URL). Only in worlds that can make effects."""
    return _wit.effects("operation_key()").operation_key()


def config(key: str) -> Optional[str]:
    """An operator-supplied setting (``[tools.NAME.config]``, or ``--config KEY=VALUE``); never
    from the model's args, never a secret. None when unset."""
    return _wit.config().get(key)
