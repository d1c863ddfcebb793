"""LangGraph scenarios for tests/integration/clients.rs: python langgraph_scenarios.py SCENARIO ORDER...

Real langgraph with its SQLite checkpointer (in $WORK), a real oncebox serve ($ONCEBOX_URL) and the
example provider ($PROVIDER_URL), where the Rust test counts the charges. Each line printed is one
JSON event.
"""

import json
import os
import signal
import sqlite3
import sys
from typing import Any, Optional, TypedDict

import httpx
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import oncebox
import oncebox.langgraph

URL = os.environ["ONCEBOX_URL"]
PROVIDER = os.environ["PROVIDER_URL"]
WORK = os.environ["WORK"]


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def charge_args(order: str, amount: int = 1200) -> dict:
    return {"order_id": order, "amount_cents": amount, "currency": "eur", "payment_method": "pm_card_visa"}


class State(TypedDict, total=False):
    order: str
    payment: str
    answer: Any


def checkpointer(name: str) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(os.path.join(WORK, f"{name}.sqlite"), check_same_thread=False))


def graph(node, name: str):
    builder = StateGraph(State)
    builder.add_node("pay", node)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    return builder.compile(checkpointer=checkpointer(name))


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def amount() -> int:
    """The amount the node charges: read anew on every run of the node (a file the test changes)."""
    try:
        with open(os.path.join(WORK, "amount")) as f:
            return int(f.read())
    except FileNotFoundError:
        return 1200


def pay_with_oncebox(client: oncebox.Client):
    def pay(state: State) -> State:
        outcome = oncebox.langgraph.call(client, "charge", charge_args(state["order"], amount()))
        emit(
            "charged",
            run_id=outcome.run_id,
            step_id=outcome.step_id,
            status=outcome.status,
            replayed=outcome.replayed,
            payment=outcome.output["id"],
        )
        if os.environ.get("KILL_AFTER_CHARGE"):
            os.kill(os.getpid(), signal.SIGKILL)  # after the charge, before LangGraph's checkpoint
        answer = interrupt({"confirm": outcome.output["id"]})
        return {"payment": outcome.output["id"], "answer": answer}

    return pay


def pay_plain(state: State) -> State:
    """The control: the same node without oncebox (a POST with no stable key)."""
    response = httpx.post(f"{PROVIDER}/payments", json=charge_args(state["order"]))
    response.raise_for_status()
    emit("charged-plain", payment=response.json()["id"])
    answer = interrupt({"confirm": response.json()["id"]})
    return {"payment": response.json()["id"], "answer": answer}


def interrupted(result: dict) -> Optional[Any]:
    found = result.get("__interrupt__")
    return found[0].value if found else None


def scenario_interrupt(order: str, control_order: str) -> None:
    """Charge, then ask a person (interrupt); resumed, the node runs again from its first line."""
    with oncebox.Client(URL) as client:
        for name, node, o in [("oncebox", pay_with_oncebox(client), order), ("plain", pay_plain, control_order)]:
            g = graph(node, name)
            first = g.invoke({"order": o}, config(f"thread-{o}"))
            emit("interrupted", graph=name, value=interrupted(first))
            done = g.invoke(Command(resume="yes"), config(f"thread-{o}"))
            emit("done", graph=name, payment=done.get("payment"), answer=done.get("answer"))


def scenario_async(order: str) -> None:
    """The same node, async, with an AsyncClient: resumed, it charges once."""
    import asyncio

    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async def main() -> None:
        async with oncebox.AsyncClient(URL) as client:

            async def pay(state: State) -> State:
                outcome = await oncebox.langgraph.acall(client, "charge", charge_args(state["order"]))
                emit("charged", step_id=outcome.step_id, replayed=outcome.replayed, payment=outcome.output["id"])
                answer = interrupt({"confirm": outcome.output["id"]})
                return {"payment": outcome.output["id"], "answer": answer}

            builder = StateGraph(State)
            builder.add_node("pay", pay)
            builder.add_edge(START, "pay")
            builder.add_edge("pay", END)
            async with AsyncSqliteSaver.from_conn_string(os.path.join(WORK, "async.sqlite")) as saver:
                g = builder.compile(checkpointer=saver)
                await g.ainvoke({"order": order}, config(f"thread-{order}"))
                done = await g.ainvoke(Command(resume="yes"), config(f"thread-{order}"))
                emit("done", payment=done.get("payment"))

    asyncio.run(main())


def scenario_kill(order: str, phase: str) -> None:
    """The process is killed right after the charge (KILL_AFTER_CHARGE); a new one resumes the thread."""
    with oncebox.Client(URL) as client:
        g = graph(pay_with_oncebox(client), "kill")
        if phase == "first":
            g.invoke({"order": order}, config(f"thread-{order}"), durability="sync")
            emit("not-killed")
        else:
            state = g.get_state(config(f"thread-{order}"))
            emit("resuming", next=list(state.next))
            result = g.invoke(None, config(f"thread-{order}"), durability="sync")
            emit("interrupted", value=interrupted(result))


def scenario_threads(order: str) -> None:
    """Two threads with the same args are two intents: two charges."""
    with oncebox.Client(URL) as client:
        g = graph(pay_with_oncebox(client), "threads")
        for thread in ["a", "b"]:
            interrupted(g.invoke({"order": order}, config(f"thread-{order}-{thread}")))


def scenario_conflict(order: str) -> None:
    """The node's args change on its re-run: the conflict reaches the graph; nothing charged twice."""
    with open(os.path.join(WORK, "amount"), "w") as f:
        f.write("1200")
    with oncebox.Client(URL) as client:
        g = graph(pay_with_oncebox(client), "conflict")
        g.invoke({"order": order}, config(f"thread-{order}"))
        with open(os.path.join(WORK, "amount"), "w") as f:
            f.write("1500")
        try:
            g.invoke(Command(resume="yes"), config(f"thread-{order}"))
            emit("no-conflict")
        except oncebox.StepConflict as e:
            emit("conflict", error=type(e).__name__, message=str(e), status=e.outcome.status)


def scenario_approval(order: str) -> None:
    """An irreversible tool: the graph stops awaiting approval, a person approves (the API, with the
    token), the graph resumes and ships once."""
    shipment = {"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]}
    with oncebox.Client(URL) as client, oncebox.Client(URL, token=os.environ["ONCEBOX_TOKEN"]) as operator:

        def ship(state: State) -> State:
            outcome = oncebox.langgraph.call(client, "fulfill", shipment)
            emit("shipped", status=outcome.status, replayed=outcome.replayed, step_id=outcome.step_id)
            return {"payment": outcome.output["id"]}

        builder = StateGraph(State)
        builder.add_node("ship", ship)
        builder.add_edge(START, "ship")
        builder.add_edge("ship", END)
        g = builder.compile(checkpointer=checkpointer("approval"))
        waiting = interrupted(g.invoke({"order": order}, config(f"thread-{order}")))
        emit("awaiting", value=waiting)
        emit("before-approval", counts=httpx.get(f"{PROVIDER}/counts/{order}").json())
        pending = operator.approvals(pending=True, run=waiting["run_id"])
        request = next(r for r in pending if r["operation_key"] == waiting["operation_key"])
        emit("approval", params=request["params"], exact=request["params_exact"], consequence=request.get("consequence"))
        operator.approve(request, by="ops", note="checked the address")
        done = g.invoke(Command(resume="approved"), config(f"thread-{order}"))
        emit("done", shipment=done.get("payment"))
        # The thread run again from its start is answered from the ledger.
        again = oncebox.Client(URL).call("fulfill", shipment, run_id=waiting["run_id"], step_id=waiting["step_id"])
        emit("again", status=again.status, replayed=again.replayed)


def scenario_unknown(order: str) -> None:
    """The charge's answer is lost (the test's provider holds it past the host's timeout): the graph
    gets OutcomeUnknown; the same ids again are still unknown; reconciling settles it from the proof."""
    import time

    with oncebox.Client(URL) as client:

        def pay(state: State) -> State:
            return {"payment": oncebox.langgraph.call(client, "charge", charge_args(state["order"])).output["id"]}

        builder = StateGraph(State)
        builder.add_node("pay", pay)
        builder.add_edge(START, "pay")
        builder.add_edge("pay", END)
        g = builder.compile(checkpointer=checkpointer("unknown"))
        try:
            g.invoke({"order": order}, config(f"thread-{order}"))
            emit("not-raised")
            return
        except oncebox.OutcomeUnknown as e:
            outcome = e.outcome
            emit("raised", error=type(e).__name__, message=str(e), step_id=outcome.step_id)
        again = client.call("charge", charge_args(order), run_id=outcome.run_id, step_id=outcome.step_id)
        emit("again", status=again.status, kind=type(again).__name__)
        for _ in range(40):  # the provider answers its lookup once its held request commits
            client.reconcile(outcome.run_id)
            settled = client.call("charge", charge_args(order), run_id=outcome.run_id, step_id=outcome.step_id)
            if settled.status != "unknown":
                break
            time.sleep(0.25)
        emit("reconciled", status=settled.status, replayed=settled.replayed)


def scenario_tool(order: str, phase: str) -> None:
    """A scripted model asks for `charge`; ToolNode runs oncebox's tool wrapper, keyed by the graph
    (never the model's tool-call id). `first` is killed after the charge, before the tools node's
    checkpoint; `resume` resumes the thread in a new process."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode

    with oncebox.Client(URL) as client:
        call = {"name": "charge", "args": charge_args(order), "id": "call_from_the_model"}
        model = FakeMessagesListChatModel(responses=[AIMessage("", tool_calls=[call])])
        tool_node = ToolNode([oncebox.langgraph.tool(client, "charge")])

        def agent(state: MessagesState) -> dict:
            return {"messages": [model.invoke(state["messages"])]}

        def tools(state: MessagesState, config) -> dict:
            result = tool_node.invoke(state, config)
            emit("tool-result", content=str(result["messages"][0].content))
            if os.environ.get("KILL_AFTER_CHARGE"):
                os.kill(os.getpid(), signal.SIGKILL)  # after the charge, before the checkpoint
            return result

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", tools)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", "tools")
        builder.add_edge("tools", END)
        g = builder.compile(checkpointer=checkpointer("tool"))
        first = {"messages": [("user", f"charge order {order}")]} if phase == "first" else None
        g.invoke(first, config(f"thread-{order}"), durability="sync")
        run = client.run(f"langgraph:thread-{order}")
        emit("run", steps=[op.get("step_id") for op in run["operations"]])


def scenario_parallel(order: str) -> None:
    """A scripted model asks for three charges in one message (two orders, the first asked twice):
    ToolNode runs them at once, each its own step by its place among the message's calls."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode

    with oncebox.Client(URL) as client:
        calls = [
            {"name": "charge", "args": charge_args(f"{order}-a"), "id": "call_a"},
            {"name": "charge", "args": charge_args(f"{order}-b"), "id": "call_b"},
            {"name": "charge", "args": charge_args(f"{order}-a"), "id": "call_a2"},
        ]
        model = FakeMessagesListChatModel(responses=[AIMessage("", tool_calls=calls)])

        def agent(state: MessagesState) -> dict:
            return {"messages": [model.invoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", ToolNode([oncebox.langgraph.tool(client, "charge")]))
        builder.add_edge(START, "agent")
        builder.add_edge("agent", "tools")
        builder.add_edge("tools", END)
        g = builder.compile(checkpointer=checkpointer("parallel"))
        done = g.invoke({"messages": [("user", f"charge {order}")]}, config(f"thread-{order}"), durability="sync")
        emit("tool-results", contents=[str(m.content) for m in done["messages"] if m.type == "tool"])
        run = client.run(f"langgraph:thread-{order}")
        emit("run", steps=sorted(op.get("step_id") for op in run["operations"]))


if __name__ == "__main__":
    scenario, *rest = sys.argv[1:]
    globals()[f"scenario_{scenario}"](*rest)
