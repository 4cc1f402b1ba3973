"""
Rules whose body decides: a GraphQL operation, an MCP tool call. `requestheaders` marks such a
match pending; once the request hook has the body, it is matched again here.

    if not body_match.settle(flow, meta, body, rules, catalog):
        return   # a query, or a message no rule names: passed through untouched

A tool call only `mcp.tools: from_server` matched, of a tool the server's `tools/list` declared
read-only (rules/tool_catalog.py), is not a write when the rules trust the server's annotations
(`mcp.annotations: trusted`); otherwise it is (the MCP specification calls annotations
untrusted unless the server is trusted; the rules name reads in `mcp.read_only_tools`, which
RuleSet.match never takes as writes). An MCP tool call keeps its JSON-RPC id and the client's
Accept in the flow's metadata: they shape every answer the proxy makes to it.
"""

from __future__ import annotations

import dataclasses

from mitmproxy import http

from proxy_addon.mitm import task_watch as tasks
from proxy_addon.mitm import tools
from proxy_addon.mitm.flows import META
from proxy_addon.rules import ANY_TOOL, RuleSet
from proxy_addon.rules.tool_catalog import ToolCatalog
from proxy_addon.wire.mcp_calls import unread_call

__all__ = ["settle"]


def settle(flow: http.HTTPFlow, meta: dict, body: bytes, rules: RuleSet, catalog: ToolCatalog) -> bool:
    """Match a pending request on its body; False (its metadata dropped) when it is not a write."""
    req = flow.request
    m = rules.match(req.host, req.port, req.method, req.path, body=body, headers=req.headers.fields)
    call = m.mcp_call if m is not None and m.operation.mcp_tool == ANY_TOOL else None  # mcp.tools: from_server
    if m is not None and call is not None and tools.read_by_annotations(flow, m.operation, call.name, catalog):
        m = None  # the server's tools/list says this tool only reads, and the rules trust it
    if m is None:  # a GraphQL query, a mutation or MCP message no rule names: passed through untouched
        api = flow.metadata.pop(META)["api"]
        tools.note_listing(flow, body, rules)  # a tools/list answer tells which tools only read
        tasks.note_read(flow, body, api)  # a tasks/get or tasks/result answer may settle a write waiting for its task
        return False
    meta.update(api=m.operation.api, operation=m.operation.name, params=m.params, graphql_args=m.graphql_args)
    meta.update(refused=m.refused, refused_as=m.refused_as)  # the mutation's operation decides, as for the rest
    if m.fingerprint_host:  # matched through another loopback name than the rule's (RuleSet)
        meta["fingerprint_host"] = m.fingerprint_host
    else:
        meta.pop("fingerprint_host", None)
    if m.operation.mcp_tool is not None:  # an MCP tool call: its id and framing shape every answer
        meta["mcp"] = dataclasses.asdict(m.mcp_call or unread_call(body, m.operation.mcp_tool, req.headers))
        meta["accept"] = req.headers.get("accept")
    return True
