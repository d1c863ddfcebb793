"""Messages for later delivery, enqueued in the same transaction as their record."""

from __future__ import annotations

from typing import Any

from . import _json, _wit


def send(label: str, topic: str, payload: Any) -> None:
    """An effect: enqueues ``payload`` (as JSON) to a topic granted to the tool; delivery may
    come later, the record may not."""
    effects = _wit.effects(f"outbox.send({label!r})")
    _wit.call(effects.outbox, label, topic, _json.dump_bytes(payload))
