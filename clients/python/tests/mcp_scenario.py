"""MCP from LangGraph, for tests/integration/clients.rs: python mcp_scenario.py ORDER first|resume|anonymous

A scripted chat model (langchain-core's fake, no LLM) asks for `charge`; LangGraph's ToolNode calls
oncebox's MCP server ($ONCEBOX_URL/mcp) through langchain-mcp-adapters, with the run and step in
`_meta` from the graph's identity (oncebox.langgraph.mcp_interceptor). `first` is killed (SIGKILL)
after the charge, before the tools node's checkpoint; `resume` resumes the thread in a new process.
`anonymous` calls the same tool without the interceptor: a write tool refuses.
"""

import asyncio
import json
import os
import signal
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_mcp_adapters.tools import load_mcp_tools
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

import oncebox
import oncebox.langgraph

URL = os.environ["ONCEBOX_URL"]
WORK = os.environ["WORK"]


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def model(order: str) -> FakeMessagesListChatModel:
    args = {"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": "pm_card_visa"}
    # The model's tool-call id is model output: oncebox never keys on it.
    return FakeMessagesListChatModel(
        responses=[AIMessage("", tool_calls=[{"name": "charge", "args": args, "id": "call_from_the_model"}])]
    )


async def main(order: str, phase: str) -> None:
    async with streamablehttp_client(f"{URL}/mcp") as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        if phase == "anonymous":
            tools = await load_mcp_tools(session)
            charge = next(t for t in tools if t.name == "charge")
            args = model(order).responses[0].tool_calls[0]["args"]
            try:
                answer = await charge.ainvoke(args)
                emit("answered", answer=str(answer))
            except Exception as e:  # the adapters raise a tool's error result
                emit("refused", error=str(e))
            return
        tools = await load_mcp_tools(session, tool_interceptors=[oncebox.langgraph.mcp_interceptor(session)])
        charge = [t for t in tools if t.name == "charge"]

        async def agent(state: MessagesState) -> dict:
            return {"messages": [await model(order).ainvoke(state["messages"])]}

        tool_node = ToolNode(charge)

        async def tools_then_maybe_die(state: MessagesState, config) -> dict:
            result = await tool_node.ainvoke(state, config)
            emit("tool-result", content=str(result["messages"][0].content))
            if os.environ.get("KILL_AFTER_CHARGE"):
                os.kill(os.getpid(), signal.SIGKILL)  # after the charge, before the checkpoint
            return result

        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_node("tools", tools_then_maybe_die)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", "tools")
        builder.add_edge("tools", END)
        async with AsyncSqliteSaver.from_conn_string(os.path.join(WORK, "mcp.sqlite")) as saver:
            graph = builder.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": f"thread-{order}"}}
            if phase == "first":
                await graph.ainvoke({"messages": [("user", f"charge order {order}")]}, config, durability="sync")
            else:
                await graph.ainvoke(None, config, durability="sync")
            emit("done")
        run = oncebox.Client(URL).run(f"langgraph:thread-{order}")
        emit("run", steps=[op.get("step_id") for op in run["operations"]], open=run["open"])


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
