"""An MCP client for the `serve` tests, on the official Python SDK (mcp 2.x).

    python mcp_client.py --scenario SCENARIO --url http://127.0.0.1:PORT/mcp [--era legacy|modern]
    python mcp_client.py --scenario SCENARIO [--era ...] -- /path/to/oncebox serve ... --stdio

Connects over streamable HTTP (--url) or starts the command after `--` and speaks stdio to it
(the environment's ONCEBOX_* variables are passed on), runs one scenario, and prints one line of
JSON: what the server answered, as the wire has it (results dumped by alias). The test that runs
this script asserts on that line and on the example provider's own counts.

--era legacy opens with `initialize` (the handshake revisions), modern with `server/discover`
(2026-07-28, where every request carries its own protocol `_meta`).

Scenarios (ORDER is --order, RUN is --run):
  list              tools/list: each tool's name, annotations and _meta
  call              charge ORDER with _meta {oncebox/run-id: RUN, oncebox/step-id: charge-ORDER}
  replay            the same call twice
  identity-missing  charge ORDER without _meta; with run_id/step_id among the arguments only;
                    and with only oncebox/run-id in _meta
  approval          fulfill ORDER (irreversible) with _meta identity
  unknown           charge ORDER with _meta identity (the test arms a fault that loses its answer)
  unknown-tool      a tool that is not loaded
  list-changed      tools/list; copy --add-tool FILE into --tools-dir; wait (at most 60 s) for
                    notifications/tools/list_changed; tools/list again
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

RUN_KEY = "oncebox/run-id"
STEP_KEY = "oncebox/step-id"


def charge_args(order: str) -> dict[str, Any]:
    return {"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": "pm_card_visa"}


def fulfill_args(order: str) -> dict[str, Any]:
    return {"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]}


def identity(run: str, step: str) -> dict[str, str]:
    return {RUN_KEY: run, STEP_KEY: step}


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def seen(result: Any) -> dict[str, Any]:
    """A tool result as the test reads it."""
    wire = dump(result)
    texts = [block.get("text", "") for block in wire.get("content", []) if block.get("type") == "text"]
    meta = wire.get("_meta") or {}
    return {
        "is_error": bool(wire.get("isError", False)),
        "status": meta.get("oncebox/status"),
        "replayed": meta.get("oncebox/replayed"),
        "source": meta.get("oncebox/source"),
        "meta": meta,
        "structured": wire.get("structuredContent"),
        "texts": texts,
    }


async def call(session: ClientSession, tool: str, args: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return seen(await session.call_tool(tool, args, meta=meta))
    except MCPError as error:
        return {"protocol_error": {"code": error.code, "message": error.message, "data": error.data}}


async def scenario_list(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    listed = await session.list_tools()
    tools = [dump(tool) for tool in listed.tools]
    return {
        "tools": {
            tool["name"]: {
                "annotations": tool.get("annotations", {}),
                "meta": tool.get("_meta", {}),
                "input_schema_type": tool.get("inputSchema", {}).get("type"),
                "has_output_schema": "outputSchema" in tool,
                "description": tool.get("description"),
            }
            for tool in tools
        }
    }


async def scenario_call(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    step = f"charge-{opts.order}"
    return await call(session, "charge", charge_args(opts.order), identity(opts.run, step))


async def scenario_replay(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    first = await scenario_call(session, opts)
    second = await scenario_call(session, opts)
    return {"first": first, "second": second}


async def scenario_identity_missing(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    in_args = charge_args(opts.order) | {"run_id": opts.run, "step_id": f"charge-{opts.order}"}
    return {
        "no_meta": await call(session, "charge", charge_args(opts.order), None),
        "in_arguments": await call(session, "charge", in_args, None),
        "run_only": await call(session, "charge", charge_args(opts.order), {RUN_KEY: opts.run}),
    }


async def scenario_approval(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    # The order id may hold characters an id may not (a direction override): the step names it
    # in ASCII.
    step = "fulfill-" + opts.order.encode("ascii", "backslashreplace").decode()
    return await call(session, "fulfill", fulfill_args(opts.order), identity(opts.run, step))


async def scenario_unknown_tool(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    return await call(session, "no-such-tool", {}, identity(opts.run, "nothing"))


async def scenario_list_changed(session: ClientSession, opts: argparse.Namespace) -> dict[str, Any]:
    before = sorted(tool.name for tool in (await session.list_tools()).tools)
    shutil.copy(opts.add_tool, os.path.join(opts.tools_dir, os.path.basename(opts.add_tool)))
    notified = False
    with anyio.move_on_after(60):
        await ListChanged.wait()
        notified = True
    after = sorted(tool.name for tool in (await session.list_tools()).tools)
    return {"before": before, "notified": notified, "after": after}


class ListChanged:
    """Set by `notifications/tools/list_changed` (a notification model, or one wrapped in a root)."""

    event: anyio.Event | None = None

    @classmethod
    async def wait(cls) -> None:
        assert cls.event is not None
        await cls.event.wait()

    @classmethod
    async def on_message(cls, message: Any) -> None:
        method = getattr(message, "method", None) or getattr(getattr(message, "root", None), "method", None)
        if method == "notifications/tools/list_changed" and cls.event is not None:
            cls.event.set()


SCENARIOS = {
    "list": scenario_list,
    "call": scenario_call,
    "replay": scenario_replay,
    "identity-missing": scenario_identity_missing,
    "approval": scenario_approval,
    "unknown": scenario_call,
    "unknown-tool": scenario_unknown_tool,
    "list-changed": scenario_list_changed,
}


@asynccontextmanager
async def connect(opts: argparse.Namespace) -> AsyncIterator[Any]:
    if opts.url:
        async with streamable_http_client(opts.url) as streams:
            yield streams
    else:
        env = {k: v for k, v in os.environ.items() if k.startswith("ONCEBOX_")}
        params = StdioServerParameters(command=opts.command[0], args=opts.command[1:], env=env)
        async with stdio_client(params, errlog=sys.stderr) as streams:
            yield streams


async def main(opts: argparse.Namespace) -> None:
    ListChanged.event = anyio.Event()
    async with connect(opts) as (read, write):
        async with ClientSession(read, write, message_handler=ListChanged.on_message) as session:
            opened = await (session.discover() if opts.era == "modern" else session.initialize())
            info = dump(opened)
            answer = await SCENARIOS[opts.scenario](session, opts)
            answer["opened"] = {
                "era": opts.era,
                "protocol_version": session.protocol_version,
                "server": dump(session.server_info) if session.server_info else info.get("serverInfo"),
                "instructions": info.get("instructions"),
                "capabilities": info.get("capabilities"),
            }
    print(json.dumps(answer), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--url", help="the server's streamable HTTP endpoint; else the command after --")
    parser.add_argument("--era", choices=["legacy", "modern"], default="legacy")
    parser.add_argument("--order", default="o-1")
    parser.add_argument("--run", default="run-1")
    parser.add_argument("--add-tool", help="list-changed: the component to copy into --tools-dir")
    parser.add_argument("--tools-dir", help="list-changed: the server's tools directory")
    parser.add_argument("command", nargs="*", help="the server to start for stdio")
    opts = parser.parse_args()
    if not opts.url and not opts.command:
        parser.error("give --url or the server's command after --")
    return opts


if __name__ == "__main__":
    anyio.run(main, parse())
