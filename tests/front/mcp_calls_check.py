"""Drives an MCP server over stdio with the Python SDK's client and prints what a client
sees of a list of calls: tools/list, each result (without germline's label) and labels.

Used by api/tests/front_startup_data.rs to compare `germline wrap` with the bare server.

usage: mcp_calls_check.py CALLS_JSON CMD [ARG...]    (JSON summary on stdout)
       CALLS_JSON is a list of [tool, arguments].
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def strip_meta(d):
    d = dict(d)
    meta = d.pop("meta", None) or {}
    label = meta.pop("dev.germline/label", None)
    if meta:
        d["meta"] = meta
    return d, label


async def exercise(session, calls):
    out = {"labels": []}
    await session.initialize()
    tools = await session.list_tools()
    listed, label = strip_meta(json.loads(tools.model_dump_json(exclude_none=True)))
    out["tools"] = sorted(listed["tools"], key=lambda t: t["name"])
    out["tools_label"] = label
    out["calls"] = []
    for name, args in calls:
        r = await session.call_tool(name, args)
        d, label = strip_meta(json.loads(r.model_dump_json(exclude_none=True)))
        out["calls"].append(d)
        out["labels"].append(label)
    return out


async def run_stdio(calls, cmd):
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as session:
            return await exercise(session, calls)


def main():
    calls = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(asyncio.wait_for(run_stdio(calls, sys.argv[2:]), 300)), sort_keys=True))


if __name__ == "__main__":
    main()
