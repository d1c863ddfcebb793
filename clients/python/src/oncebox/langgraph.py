"""oncebox inside a LangGraph node: the run and step come from the running graph's durable identity.

LangGraph runs a node again from its first line when a thread resumes after ``interrupt()`` or a
crash. The node's ``thread_id`` and ``checkpoint_ns`` (``node:<task id>``, the task id derived from
the checkpoint the node started from) are the same in both runs, so a call keyed by them is
answered from oncebox's ledger the second time instead of being done again:

- run  = ``langgraph:<thread_id>``
- step = ``<checkpoint_ns>/<n>``: ``n`` counts the node's calls in this execution (0, 1, ...), or
  ``step=NAME`` names it (for calls whose order may change between runs).

Never from the model: a tool call's id is model output, and is never the key.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional

from langgraph.config import get_config
from langgraph.prebuilt import ToolRuntime
from langgraph.types import interrupt

from ._client import AsyncClient, Client
from ._outcome import AnyOutcome, AwaitingApproval, InProgress, StillAwaitingApproval, settled

# The counter of one node execution, kept in that execution's own `configurable` dict (LangGraph
# makes a new one for every task it runs, a resumed one included).
_ORDINAL = "__oncebox_ordinal"
_LOCK = threading.Lock()


def identity(step: Optional[str] = None) -> tuple[str, str]:
    """``(run_id, step_id)`` of the call about to be made by the running node."""
    try:
        config = get_config()
    except RuntimeError as e:
        raise RuntimeError("oncebox.langgraph.call runs inside a LangGraph node (or tool) only") from e
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    namespace = configurable.get("checkpoint_ns")
    if thread_id is None or not namespace:
        raise RuntimeError(
            "oncebox.langgraph.call needs a graph compiled with a checkpointer and invoked with "
            "config={'configurable': {'thread_id': ...}}: without them a resumed node has no durable identity"
        )
    if step is None:
        with _LOCK:
            n = configurable.get(_ORDINAL, 0)
            configurable[_ORDINAL] = n + 1
        step = str(n)
    elif not isinstance(step, str) or not step:
        raise ValueError(f"`step` must be a non-empty name, got {step!r}")
    return f"langgraph:{thread_id}", f"{namespace}/{step}"


def call(
    client: Client, tool: str, args: Mapping[str, Any], *, step: Optional[str] = None, wait: float = 30.0
) -> AnyOutcome:
    """Calls ``tool`` for the running node: completed outcomes are returned.

    A step awaiting approval stops the graph with ``interrupt()`` (the person approves through the
    API or the console; resume with any ``Command(resume=...)``, and the call is made again, now
    approved). A conflict (the node's args changed on re-run), an unknown outcome and a failure are
    raised (``StepConflict``, ``OutcomeUnknown``, ``StepFailed``).
    """
    run_id, step_id = identity(step)
    outcome = client.call(tool, args, run_id=run_id, step_id=step_id, wait=wait)
    if isinstance(outcome, AwaitingApproval):
        interrupt(_awaiting(outcome, tool, run_id, step_id))
        # Resumed: the person decided (or not); ask again.
        outcome = client.call(tool, args, run_id=run_id, step_id=step_id, wait=wait)
        if isinstance(outcome, AwaitingApproval):
            raise StillAwaitingApproval(outcome)
    if isinstance(outcome, InProgress):
        return outcome
    return settled(outcome)


async def acall(
    client: AsyncClient, tool: str, args: Mapping[str, Any], *, step: Optional[str] = None, wait: float = 30.0
) -> AnyOutcome:
    """:func:`call` for an async node, with an :class:`oncebox.AsyncClient`."""
    run_id, step_id = identity(step)
    outcome = await client.call(tool, args, run_id=run_id, step_id=step_id, wait=wait)
    if isinstance(outcome, AwaitingApproval):
        interrupt(_awaiting(outcome, tool, run_id, step_id))
        outcome = await client.call(tool, args, run_id=run_id, step_id=step_id, wait=wait)
        if isinstance(outcome, AwaitingApproval):
            raise StillAwaitingApproval(outcome)
    if isinstance(outcome, InProgress):
        return outcome
    return settled(outcome)


def _awaiting(outcome: AwaitingApproval, tool: str, run_id: str, step_id: str) -> dict[str, Any]:
    """What ``interrupt()`` hands the graph's caller while a step awaits approval."""
    return {
        "oncebox": "awaiting-approval",
        "operation_key": outcome.operation_key,
        "tool": tool,
        "run_id": run_id,
        "step_id": step_id,
        "consequence": outcome.consequence,
        "params": outcome.params,
    }


def tool(client: Client, name: str, description: Optional[str] = None, args_schema: Any = None) -> Any:
    """A LangChain tool that calls oncebox's ``name`` with the graph's identity.

    For a model's tool calls run by LangGraph's ``ToolNode``: the step is
    ``<checkpoint_ns>/tool:<name>/<n>``, ``n`` the call's place among the calls of ``name`` in
    the message that asked for them (0, 1, ...; see :func:`nth_call`), never the model's
    tool-call id. ``args_schema`` defaults to the tool's input schema as the server lists it; the
    tool's output is the outcome's ``output``.
    """
    from langchain_core.tools import StructuredTool

    if args_schema is None or description is None:
        listed = next((t for t in client.tools()["tools"] if t["name"] == name), None)
        if listed is None:
            raise ValueError(f"oncebox serves no tool named {name!r}")
        args_schema = args_schema if args_schema is not None else listed["input_schema"]
        description = description if description is not None else listed["description"]

    def run(runtime: ToolRuntime, **args: Any) -> Any:
        return call(client, name, args, step=f"tool:{name}/{nth_call(runtime)}").output

    return StructuredTool.from_function(func=run, name=name, description=description, args_schema=args_schema)


def nth_call(runtime: Any) -> int:
    """The place of the tool call ``runtime`` runs among the calls of the same tool in the message
    that asked for them (0, 1, ...), the tool as the message names it.

    ``ToolNode`` runs a message's tool calls at once, each in a config of its own, so no counter
    can number them; the message is in the checkpoint, so its calls' order is the same on every
    run of the node. The tool-call id only finds the call in it: it is model output, and never
    part of the key. The message is looked for in the state's lists of messages (``messages``, or
    another key a ``ToolNode`` was given, or the state itself when it is a list).
    """
    call_id = getattr(runtime, "tool_call_id", None)
    for message in reversed(list(_messages(getattr(runtime, "state", None)))):
        calls = list(getattr(message, "tool_calls", None) or [])
        ids = [c.get("id") for c in calls]
        if call_id is None or call_id not in ids:
            continue
        if ids.count(call_id) > 1:
            raise RuntimeError(
                f"two tool calls of one message share the id {call_id!r}: oncebox cannot tell them apart, "
                "so neither is made"
            )
        place = ids.index(call_id)
        own = calls[place].get("name")
        return sum(1 for c in calls[:place] if c.get("name") == own)
    raise RuntimeError(
        "oncebox.langgraph.tool runs in LangGraph's ToolNode: the tool call "
        f"{call_id!r} was not found in the state's messages, so its place (its step) is unknown and nothing is called"
    )


def _messages(state: Any) -> Any:
    """Every message of ``state``: the state itself when it is a list, else each list it holds."""
    if isinstance(state, list):
        yield from state
        return
    if isinstance(state, Mapping):
        fields = list(state.values())
    else:
        fields = list(getattr(state, "__dict__", {}).values())
    for value in fields:
        if isinstance(value, list):
            yield from value


#: The request `_meta` keys oncebox's MCP server reads a call's identity from.
MCP_RUN = "oncebox/run-id"
MCP_STEP = "oncebox/step-id"


def mcp_meta(step: Optional[str] = None) -> dict[str, str]:
    """The ``_meta`` of an MCP ``tools/call`` made by the running node: its run and step."""
    run_id, step_id = identity(step)
    return {MCP_RUN: run_id, MCP_STEP: step_id}


def mcp_interceptor(session: Any) -> Any:
    """A ``tool_interceptors`` entry for langchain-mcp-adapters' ``load_mcp_tools(session, ...)``:
    each MCP tool call a graph's ``ToolNode`` makes carries the graph's identity in ``_meta``
    (step ``mcp:<tool>/<n>``, ``n`` as :func:`nth_call` places it; never the model's tool-call id).

    It sends the call on ``session`` itself, because the adapters do not pass ``_meta`` on.
    """

    async def intercept(request: Any, handler: Any) -> Any:
        meta = mcp_meta(f"mcp:{request.name}/{nth_call(request.runtime)}")
        return await session.call_tool(request.name, request.args, meta=meta)

    return intercept
