"""
A reconcile read through an MCP server's read-only tool (`reconcile.read: {tool, arguments}`).

    status, headers, body = await read_tool(url, "list_issues", {"state": "all"}, credentials, settings)

It opens a session of its own on the endpoint (the 2025-11-25 revision: `initialize`, then
`notifications/initialized`), with the duplicate's own credentials, and never reuses the
agent's session. Unless the rule vouches that the tool is read-only (`read_only: true`), it
first reads the server's `tools/list` and calls the tool only when its annotations say
`readOnlyHint: true`: a tool that may write is never called to reconcile. Then it calls the
tool once and ends the session (DELETE).

What it returns is what the rest of reconcile reads (judge.py): HTTP 200 and the tool's result
document as JSON (its structuredContent, else its text content parsed as JSON). A tool error
(`isError`), a JSON-RPC error or an answer without the result is a failed read
(ReconcileError): it proves nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from proxy_addon.errors import ReconcileError
from proxy_addon.mcp.jsonrpc import response_for
from proxy_addon.mcp.outcomes import result_view

PROTOCOL_VERSION = "2025-11-25"
MAX_TOOL_PAGES = 20  # tools/list pages read to find the tool's annotations
ACCEPT = "application/json, text/event-stream"


class _Session:
    def __init__(self, client: httpx.AsyncClient, url: str, credentials: Mapping[str, str]):
        self.client, self.url = client, url
        self.headers = {"accept": ACCEPT, "content-type": "application/json", **credentials}
        self.next_id = 0

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        r = await self.client.post(self.url, headers=self.headers, content=json.dumps(message).encode())
        if r.status_code // 100 != 2:
            raise ReconcileError(f"MCP {method} answered HTTP {r.status_code}")
        if method == "initialize" and (session := r.headers.get("mcp-session-id")):
            self.headers["mcp-session-id"] = session
        found = response_for(r.content, r.headers.get("content-type"), self.next_id)
        if found is None:
            raise ReconcileError(f"MCP {method}: no JSON-RPC response in the answer")
        if "error" in found:
            error = found["error"] if isinstance(found["error"], dict) else {}
            raise ReconcileError(f"MCP {method}: JSON-RPC error {str(error.get('code'))[:20]}")
        result = found.get("result")
        return result if isinstance(result, dict) else {}

    async def notify(self, method: str) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        await self.client.post(self.url, headers=self.headers, content=json.dumps(message).encode())

    async def close(self) -> None:
        if "mcp-session-id" in self.headers:
            with contextlib.suppress(httpx.HTTPError):  # the server ends idle sessions itself
                await self.client.delete(self.url, headers=self.headers)


async def read_only(session: _Session, tool: str) -> bool:
    """Whether the server's tools/list declares the tool read-only (annotations.readOnlyHint true)."""
    cursor = None
    for _ in range(MAX_TOOL_PAGES):
        page = await session.request("tools/list", {"cursor": cursor} if cursor else {})
        for t in page.get("tools") or ():
            if isinstance(t, dict) and t.get("name") == tool:
                annotations = t.get("annotations")
                return isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
        cursor = page.get("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            return False
    return False


async def read_tool(
    client: httpx.AsyncClient,
    url: str,
    tool: str,
    arguments: dict[str, Any],
    credentials: Mapping[str, str],
    *,
    declared_read_only: bool,
) -> tuple[int, dict[str, str], bytes]:
    session = _Session(client, url, credentials)
    try:
        await session.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "receipt-proxy-reconcile", "version": "1"},
            },
        )
        session.headers["mcp-protocol-version"] = PROTOCOL_VERSION
        await session.notify("notifications/initialized")
        if not declared_read_only and not await read_only(session, tool):
            raise ReconcileError(
                f"refusing to call the MCP tool {tool!r} to reconcile: the server's tools/list does not declare it "
                "read-only (readOnlyHint), and the rule does not (read_only: true); a read never risks a write"
            )
        result = await session.request("tools/call", {"name": tool, "arguments": arguments})
    finally:
        await session.close()
    view = result_view({"result": result})
    if view["isError"]:
        raise ReconcileError(f"the MCP tool {tool!r} answered isError: a failed read proves nothing")
    if view["document"] is None:
        raise ReconcileError(f"the MCP tool {tool!r} answered no structuredContent and no JSON text")
    return 200, {"content-type": "application/json"}, json.dumps(view["document"]).encode()
