"""Drives an MCP server with the Python SDK's own clients and prints what a client sees.

Used by api/tests/front_mcp.rs to compare `germline wrap` (stdio and Streamable HTTP)
with the bare server: tools/list, tool results, tool errors, protocol errors, ping.

usage: mcp_client_check.py stdio CMD [ARG...]    (JSON summary on stdout)
       mcp_client_check.py http URL
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

CALLS = [
    ("convert_time", {"source_timezone": "Europe/London", "time": "12:30", "target_timezone": "Asia/Tokyo"}),
    ("convert_time", {"source_timezone": "America/New_York", "time": "23:59", "target_timezone": "UTC"}),
    ("convert_time", {"source_timezone": "Europe/London", "time": "25:99", "target_timezone": "UTC"}),
    ("get_current_time", {"timezone": "Nowhere/Invalid"}),
]


def strip_meta(d):
    d = dict(d)
    meta = d.pop("meta", None) or {}
    label = meta.pop("dev.germline/label", None)
    if meta:
        d["meta"] = meta
    return d, label


async def exercise(session):
    out = {"labels": []}
    init = await session.initialize()
    out["protocolVersion"] = init.protocolVersion
    out["has_tools_capability"] = init.capabilities.tools is not None
    await session.send_ping()
    tools = await session.list_tools()
    out["tools"] = sorted(
        [json.loads(t.model_dump_json(exclude_none=True)) for t in tools.tools], key=lambda t: t["name"]
    )
    out["calls"] = []
    for name, args in CALLS:
        r = await session.call_tool(name, args)
        d, label = strip_meta(json.loads(r.model_dump_json(exclude_none=True)))
        out["calls"].append(d)
        out["labels"].append(label)
    r = await session.call_tool("get_current_time", {"timezone": "Europe/London"})
    out["current_time_ok"] = (not r.isError) and "Europe/London" in r.content[0].text
    errors = []
    for name in ["no_such_tool"]:
        try:
            r = await session.call_tool(name, {})
            errors.append({"isError": r.isError})
        except McpError as e:
            errors.append({"code": e.error.code})
    out["errors"] = errors
    try:
        await session.list_prompts()
        out["prompts"] = "ok"
    except McpError as e:
        out["prompts"] = e.error.code
    return out


async def run_stdio(cmd):
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as session:
            return await exercise(session)


async def run_http(url):
    async with streamablehttp_client(url) as (r, w, _):
        async with ClientSession(r, w) as session:
            return await exercise(session)


def main():
    mode = sys.argv[1]
    coro = run_stdio(sys.argv[2:]) if mode == "stdio" else run_http(sys.argv[2])
    print(json.dumps(asyncio.run(asyncio.wait_for(coro, 300)), sort_keys=True))


if __name__ == "__main__":
    main()
