"""oncebox inside a DBOS workflow or step: the run is the workflow id, the step DBOS's step id.

DBOS records a step's output after the step returns: a process killed between the effect and that
record runs the step again on recovery, with the same workflow id and the same function id (DBOS
numbers a workflow's steps deterministically). A call keyed by them is answered from oncebox's
ledger the second time:

- run  = ``dbos:<workflow id>``
- step = ``<function id>`` of the running step (inside a ``@DBOS.step()``), or ``step=NAME``
  (required when called from the workflow's own body, where no step is running).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from dbos import DBOS

from ._client import AsyncClient, Client
from ._outcome import AnyOutcome, settled


def identity(step: Optional[str] = None) -> tuple[str, str]:
    """``(run_id, step_id)`` for a call made by the running DBOS workflow or step."""
    workflow_id = DBOS.workflow_id
    if not workflow_id:
        raise RuntimeError("oncebox.dbos.call runs inside a DBOS workflow or step only")
    if step is None:
        function_id = DBOS.step_id
        if function_id is None:
            raise ValueError(
                "outside a @DBOS.step() there is no step id: name the call with step=NAME (stable across recovery)"
            )
        step = f"step-{function_id}"
    elif not isinstance(step, str) or not step:
        raise ValueError(f"`step` must be a non-empty name, got {step!r}")
    return f"dbos:{workflow_id}", step


def call(
    client: Client, tool: str, args: Mapping[str, Any], *, step: Optional[str] = None, wait: float = 30.0
) -> AnyOutcome:
    """Calls ``tool`` for the running DBOS step: a completed outcome, or the error to raise
    (``StepConflict``, ``OutcomeUnknown``, ``StepFailed``). Awaiting approval and in-progress come
    back as outcomes: let the workflow wait (``DBOS.sleep``) and call again with the same step."""
    run_id, step_id = identity(step)
    return settled(client.call(tool, args, run_id=run_id, step_id=step_id, wait=wait))


async def acall(
    client: AsyncClient, tool: str, args: Mapping[str, Any], *, step: Optional[str] = None, wait: float = 30.0
) -> AnyOutcome:
    """:func:`call` for an async DBOS step, with an :class:`oncebox.AsyncClient`."""
    run_id, step_id = identity(step)
    return settled(await client.call(tool, args, run_id=run_id, step_id=step_id, wait=wait))
