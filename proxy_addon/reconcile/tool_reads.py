"""
A reconcile read through an MCP server's read-only tool (`reconcile.read: {tool, arguments}`).

    status, headers, body = await read_tool(client, url, "list_issues", {"state": "all"}, credentials,
                                            declared_read_only=False, revision="2026-07-28")

It speaks the protocol revision the write was sent in (`revision`: the receipt's intent notes it,
`mcp_revision`), with the duplicate's own credentials, and never reuses the agent's session:
- 2026-07-28 (modern): no `initialize` and no session. Each request is one POST with the request
  metadata that revision requires: the `MCP-Protocol-Version` and `Mcp-Method` headers, for
  tools/call `Mcp-Name` and the `Mcp-Param-*` headers the tool's inputSchema asks for
  (`x-mcp-header`: wire/mcp_headers.py), and `params._meta` holding the protocol version, the
  client's info and its capabilities (none).
- 2025-11-25 and earlier (legacy): a session of its own: `initialize`, `notifications/initialized`,
  then the requests with its Mcp-Session-Id and the negotiated MCP-Protocol-Version, and DELETE
  at the end.
- Not recorded (a receipt made before receipt-proxy noted it) or another modern revision:
  `server/discover` in 2026-07-28 first, as the SDK's client does: a DiscoverResult that lists
  2026-07-28 → modern; one that lists no modern revision, or an error that says the endpoint may
  speak a legacy one (below; or a 2xx JSON-RPC error that is no modern one: a modern server
  implements discover) → legacy.
A modern read falls back to legacy only where the endpoint's answer says it may speak it, as
the specification's backward compatibility has a client that speaks both do: an
UnsupportedProtocolVersion error (-32022) whose `supported` list names a legacy revision, or a
400, 404 or 405 without a recognized modern error (-32020, -32021, -32022; -32601 with a 404),
such as a legacy server's 400 for a request without its session. The legacy read then says
whether it does. A read of a write sent in a legacy revision is legacy (the endpoint spoke it),
unless the endpoint refuses it with an UnsupportedProtocolVersion error naming 2026-07-28 (it
moved on since the write): then modern.

Unless the rule vouches that the tool is read-only (`read_only: true`), it first reads the
server's `tools/list` and calls the tool only when its annotations say `readOnlyHint: true`: a
tool that may write is never called to reconcile. Then it calls the tool once. (A modern server
that answers HeaderMismatch, -32020, to a call sent without the tool's inputSchema at hand, as
with `read_only: true`, is asked for its tools/list, and the call is made once more with the
`Mcp-Param-*` headers the schema asks for, as the specification says a client should. The
call was refused before the tool ran, and the tool only reads.)

What it returns is what the rest of reconcile reads (reconcile/judge.py): HTTP 200 and the tool's result
document as JSON (its structuredContent, else its text content parsed as JSON). A tool error
(`isError`), a result that is not complete (`resultType` other than `complete`: the tool asks
for input, or answers with a task), a JSON-RPC error or an answer without the result is a failed
read (ReconcileError): it proves nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from proxy_addon.errors import ReconcileError
from proxy_addon.outcome.tool_outcomes import answer_of, result_view
from proxy_addon.wire.mcp_calls import PROTOCOL_VERSION_META, revision_of
from proxy_addon.wire.mcp_headers import header_value, invalid_header_schema, param_headers

LEGACY = "2025-11-25"  # the legacy revision a read asks for in its initialize
MODERN = "2026-07-28"  # the modern revision a read speaks
LEGACY_REVISIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022
METHOD_NOT_FOUND = -32601
MODERN_ERRORS = frozenset({HEADER_MISMATCH, -32021, UNSUPPORTED_PROTOCOL_VERSION})  # only a modern server says these
MAX_TOOL_PAGES = 20  # tools/list pages read to find the tool
ACCEPT = "application/json, text/event-stream"
CLIENT_INFO = {"name": "receipt-proxy-reconcile", "version": "1"}


class RpcError(ReconcileError):
    """A request of the read was answered with an HTTP error or a JSON-RPC error (`code`: None without one)."""

    def __init__(self, method: str, status: int, error: Mapping[str, Any] | None):
        self.status = status
        self.code = error.get("code") if error is not None else None
        self.data = error.get("data") if error is not None else None
        said = f"JSON-RPC error {str(self.code)[:20]}" if error is not None else "no JSON-RPC error"
        super().__init__(f"MCP {method} answered HTTP {status}, {said}")

    def supports(self) -> list[str]:
        """The revisions an UnsupportedProtocolVersion error says the server supports."""
        supported = self.data.get("supported") if isinstance(self.data, dict) else None
        return [v for v in supported if isinstance(v, str)] if isinstance(supported, list) else []


def _error_in(r: httpx.Response, request_id: int) -> Mapping[str, Any] | None:
    """The JSON-RPC error an answer holds for the request (outcomes.answer_of: by its id, or without one in JSON)."""
    found = answer_of(r.content, r.headers.get("content-type"), request_id)
    error = found.get("error") if found is not None else None
    return error if isinstance(error, dict) else None


class _Session:
    """The requests of one read, in the revision it speaks (module docstring)."""

    def __init__(self, client: httpx.AsyncClient, url: str, credentials: Mapping[str, str], revision: str):
        self.client, self.url, self.revision = client, url, revision
        self.headers = {"accept": ACCEPT, "content-type": "application/json", **credentials}
        self.next_id = 0

    @property
    def modern(self) -> bool:
        return self.revision not in LEGACY_REVISIONS

    async def request(
        self, method: str, params: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        self.next_id += 1
        sent = {**self.headers, **(headers or {})}
        if self.modern:
            meta = {
                PROTOCOL_VERSION_META: self.revision,
                "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            params = {**params, "_meta": meta}
            sent.update({"mcp-protocol-version": self.revision, "mcp-method": method})
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        r = await self.client.post(self.url, headers=sent, content=json.dumps(message).encode())
        if r.status_code // 100 != 2:
            raise RpcError(method, r.status_code, _error_in(r, self.next_id))
        if method == "initialize" and (session := r.headers.get("mcp-session-id")):
            self.headers["mcp-session-id"] = session
        found = answer_of(r.content, r.headers.get("content-type"), self.next_id)
        if found is None:
            raise ReconcileError(f"MCP {method}: no JSON-RPC response in the answer")
        if "error" in found:
            raise RpcError(method, r.status_code, found["error"] if isinstance(found["error"], dict) else {})
        result = found.get("result")
        return result if isinstance(result, dict) else {}

    async def notify(self, method: str) -> None:
        message = {"jsonrpc": "2.0", "method": method}
        await self.client.post(self.url, headers=self.headers, content=json.dumps(message).encode())

    async def initialize(self) -> None:
        """The legacy handshake (initialize, notifications/initialized); later requests carry the revision agreed."""
        result = await self.request(
            "initialize", {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": CLIENT_INFO}
        )
        negotiated = revision_of(result.get("protocolVersion"))
        self.revision = negotiated if negotiated in LEGACY_REVISIONS else LEGACY
        self.headers["mcp-protocol-version"] = self.revision
        await self.notify("notifications/initialized")

    async def close(self) -> None:
        if "mcp-session-id" in self.headers:
            with contextlib.suppress(httpx.HTTPError):  # the server ends idle sessions itself
                await self.client.delete(self.url, headers=self.headers)


async def tool_entry(session: _Session, tool: str) -> dict[str, Any] | None:
    """The tool's entry in the server's tools/list (its annotations, its inputSchema), or None."""
    cursor = None
    for _ in range(MAX_TOOL_PAGES):
        page = await session.request("tools/list", {"cursor": cursor} if cursor else {})
        for t in page.get("tools") or ():
            if isinstance(t, dict) and t.get("name") == tool:
                return t
        cursor = page.get("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            return None
    return None


def _read_only(entry: dict[str, Any] | None) -> bool:
    """Whether the tools/list entry declares the tool read-only (annotations.readOnlyHint true)."""
    annotations = entry.get("annotations") if entry is not None else None
    return isinstance(annotations, dict) and annotations.get("readOnlyHint") is True


async def _revision_of_endpoint(client: httpx.AsyncClient, url: str, credentials: Mapping[str, str]) -> str:
    """
    The revision to read in when the write's is not known: `server/discover` in the modern one,
    and what its answer says (module docstring). A server that answers discover with a JSON-RPC
    error that is no modern one does not implement it, and a modern server must: legacy.
    """
    probe = _Session(client, url, credentials, MODERN)
    try:
        found = await probe.request("server/discover", {})
    except RpcError as e:
        if _speaks_legacy(e) or (e.status // 100 == 2 and e.code not in MODERN_ERRORS):
            return LEGACY
        raise
    versions = found.get("supportedVersions")
    return MODERN if isinstance(versions, list) and MODERN in versions else LEGACY


def _speaks_legacy(e: RpcError) -> bool:
    """
    Whether a modern request's error says the endpoint may speak a legacy revision (the
    specification's backward compatibility): UnsupportedProtocolVersion naming a legacy revision
    among those it supports; or 400, 404 or 405 without a recognized modern error (HeaderMismatch,
    MissingRequiredClientCapability, UnsupportedProtocolVersion; a 404 with Method not found).
    """
    if e.code == UNSUPPORTED_PROTOCOL_VERSION:
        return any(v in LEGACY_REVISIONS for v in e.supports())
    if e.status not in (400, 404, 405) or e.code in MODERN_ERRORS:
        return False
    return not (e.status == 404 and e.code == METHOD_NOT_FOUND)


def _other_revision(speaks: str, e: RpcError) -> str | None:
    """The revision to read in after a read in `speaks` failed with `e`, when the answer says the endpoint speaks it."""
    if speaks == MODERN:
        return LEGACY if _speaks_legacy(e) else None
    # A legacy read refused as a modern server refuses it (the endpoint moved on since the write): modern.
    return MODERN if e.code == UNSUPPORTED_PROTOCOL_VERSION and MODERN in e.supports() else None


async def read_tool(
    client: httpx.AsyncClient,
    url: str,
    tool: str,
    arguments: dict[str, Any],
    credentials: Mapping[str, str],
    *,
    declared_read_only: bool,
    revision: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    if revision in LEGACY_REVISIONS:
        speaks = LEGACY
    else:
        speaks = MODERN if revision == MODERN else await _revision_of_endpoint(client, url, credentials)
    try:
        result = await _read(client, url, tool, arguments, credentials, speaks, declared_read_only)
    except RpcError as e:
        other = _other_revision(speaks, e)
        if other is None:
            raise
        try:
            result = await _read(client, url, tool, arguments, credentials, other, declared_read_only)
        except ReconcileError as again:
            raise ReconcileError(f"{e}; read again in {other}: {again}") from again
    if result.get("resultType", "complete") != "complete":
        raise ReconcileError(
            f"the MCP tool {tool!r} answered resultType {str(result.get('resultType'))[:40]!r}, not a complete result: "
            "a read that asks for input or answers later proves nothing"
        )
    view = result_view({"result": result})
    if view["isError"]:
        raise ReconcileError(f"the MCP tool {tool!r} answered isError: a failed read proves nothing")
    if view["document"] is None:
        raise ReconcileError(f"the MCP tool {tool!r} answered no structuredContent and no JSON text")
    return 200, {"content-type": "application/json"}, json.dumps(view["document"]).encode()


async def _read(
    client: httpx.AsyncClient,
    url: str,
    tool: str,
    arguments: dict[str, Any],
    credentials: Mapping[str, str],
    revision: str,
    declared_read_only: bool,
) -> dict[str, Any]:
    """The tool's result, read in `revision` (LEGACY: in a session of its own)."""
    session = _Session(client, url, credentials, revision)
    try:
        if not session.modern:
            await session.initialize()
        entry = None if declared_read_only else await tool_entry(session, tool)
        if not declared_read_only and not _read_only(entry):
            raise ReconcileError(
                f"refusing to call the MCP tool {tool!r} to reconcile: the server's tools/list does not declare it "
                "read-only (readOnlyHint), and the rule does not (read_only: true); a read never risks a write"
            )
        if not session.modern:
            return await session.request("tools/call", {"name": tool, "arguments": arguments})
        try:
            return await _modern_call(session, tool, arguments, entry)
        except RpcError as e:
            if e.code != HEADER_MISMATCH or entry is not None:
                raise
            return await _modern_call(session, tool, arguments, await tool_entry(session, tool))
    finally:
        await session.close()


async def _modern_call(
    session: _Session, tool: str, arguments: dict[str, Any], entry: dict[str, Any] | None
) -> dict[str, Any]:
    """A modern tools/call, with Mcp-Name and the Mcp-Param-* headers of the tool's inputSchema (when known)."""
    schema = entry.get("inputSchema") if entry is not None else None
    if (why := invalid_header_schema(schema)) is not None:
        raise ReconcileError(f"the MCP tool {tool!r} has an invalid definition ({why}): clients must not call it")
    headers = {"mcp-name": header_value(tool), **param_headers(schema, arguments)}
    return await session.request("tools/call", {"name": tool, "arguments": arguments}, headers)
