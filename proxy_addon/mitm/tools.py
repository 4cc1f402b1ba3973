"""
`mcp: {tools: from_server}`: the tools/list answers passing through the proxy tell which of an
endpoint's tools the server says only read (rules/tool_catalog.py). A tools/list request to such an
endpoint is noted in the request hook; its answer, JSON or an event stream, is read in the
response hook, and one log line says which tools are taken as reads and why: named in
`mcp.read_only_tools`, or declared `readOnlyHint: true` by a server whose annotations the rules
trust (`mcp.annotations: trusted`); and which the server declares read-only but are taken as
writes, because its annotations are not trusted.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from proxy_addon.rules import ANY_TOOL, Operation, RuleSet
from proxy_addon.rules.tool_catalog import ToolCatalog
from proxy_addon.wire.canonical import canonical_host
from proxy_addon.wire.jsonpath import parse_json
from proxy_addon.wire.jsonrpc import response_for
from proxy_addon.wire.terminal import escape_controls

logger = logging.getLogger(__name__)

LISTING = "receipts_tools_list"  # flow.metadata: (endpoint, JSON-RPC id, first page) of a tools/list request


def endpoint_of(flow: http.HTTPFlow, op: Operation) -> str:
    """The catalog's name for the endpoint a flow went to: host, port and the endpoint's path template."""
    req = flow.request
    return f"{op.api} {canonical_host(req.host)}:{req.port}{op.path.template}"


def say_reads(rules: RuleSet) -> None:
    """One log line per `from_server` endpoint, as its rules load: which tools are reads, and why."""
    for op in rules.operations:
        if op.mcp_tool != ANY_TOOL:
            continue
        where = f"{op.source}:{op.line}"
        trust = (
            "and those its server's tools/list declares readOnlyHint: true (mcp.annotations: trusted)"
            if op.mcp_trusts_annotations
            else "and no other: the server's readOnlyHint is not trusted (set mcp.annotations: trusted to trust it)"
        )
        logger.info(
            f"receipt-proxy: {op.api} {op.path.template} (mcp.tools: from_server, {where}): every tool call is a "
            f"write but those of the tools named in mcp.read_only_tools ({_names(list(op.mcp_read_tools))}), {trust}"
        )


def read_by_annotations(flow: http.HTTPFlow, op: Operation, tool: str, catalog: ToolCatalog) -> bool:
    """Whether a from_server tool call is a read for its server's annotations: only when the rules trust them."""
    return op.mcp_trusts_annotations and catalog.read_only(endpoint_of(flow, op), tool)


def note_listing(flow: http.HTTPFlow, body: bytes, rules: RuleSet) -> None:
    """A tools/list request to a from_server endpoint: its answer is read in the response hook."""
    req = flow.request
    op = rules.from_server(req.host, req.port, req.path)
    if op is None or req.method != "POST":
        return
    doc = parse_json(body)
    if not isinstance(doc, dict) or doc.get("method") != "tools/list" or doc.get("id") is None:
        return
    params = doc.get("params")
    first = not (isinstance(params, dict) and params.get("cursor"))
    trust = (list(op.mcp_read_tools), op.mcp_trusts_annotations, f"{op.source}:{op.line}")  # plain data: metadata
    flow.metadata[LISTING] = (endpoint_of(flow, op), doc["id"], first, trust)


def learn(flow: http.HTTPFlow, catalog: ToolCatalog) -> None:
    noted = flow.metadata.pop(LISTING, None)
    resp = flow.response
    if noted is None or resp is None or resp.status_code // 100 != 2:
        return
    endpoint, call_id, first, trust = noted
    try:
        body = resp.content or b""
    except ValueError:  # a Content-Encoding mitmproxy cannot undo: nothing learnt
        return
    found = response_for(body, resp.headers.get("content-type"), call_id)
    if found is None or not isinstance(found.get("result"), dict):
        return
    n = catalog.learn(endpoint, found["result"], first_page=first)
    logger.info(
        f"receipt-proxy: {endpoint}: tools/list named {n} tools; {reads_said(*trust, listed=catalog.tools(endpoint))}"
    )


def reads_said(read_tools: list[str], trusted: bool, where: str, *, listed: dict[str, bool]) -> str:
    """Which listed tools the proxy takes as reads and why, and which as writes (the log line's words)."""
    named = [t for t in listed if t in read_tools]
    hinted = [t for t, ro in listed.items() if ro and t not in read_tools]
    writes = [t for t, ro in listed.items() if not ro and t not in read_tools]
    parts = [f"reads named in mcp.read_only_tools ({where}): {_names(named)}"]
    if trusted:
        parts.append(f"reads by the server's readOnlyHint: true (mcp.annotations: trusted, {where}): {_names(hinted)}")
    else:
        writes = hinted + writes
        if hinted:
            parts.append(
                f"the server says readOnlyHint: true of {_names(hinted)}, but its annotations are not trusted "
                f"({where}; the MCP specification calls them untrusted): writes, unless named in mcp.read_only_tools"
            )
    parts.append(f"writes: {_names(writes)}")
    return "; ".join(parts)


def _names(tools: list[str]) -> str:
    shown = sorted(escape_controls(t)[:64] for t in tools)
    return (", ".join(shown[:20]) or "none") + (" …" if len(shown) > 20 else "")
