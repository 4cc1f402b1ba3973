"""
`mcp: {tools: from_server}`: the tools/list answers passing through the proxy tell which of an
endpoint's tools only read (mcp/catalog.py). A tools/list request to such an endpoint is noted
in the request hook; its answer, JSON or an event stream, is read in the response hook.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from proxy_addon.canonical import canonical_host
from proxy_addon.jsonpath import parse_json
from proxy_addon.mcp.catalog import ToolCatalog
from proxy_addon.mcp.jsonrpc import response_for
from proxy_addon.rules import Operation, RuleSet
from proxy_addon.terminal import escape_controls

logger = logging.getLogger(__name__)

LISTING = "receipts_tools_list"  # flow.metadata: (endpoint, JSON-RPC id, first page) of a tools/list request


def endpoint_of(flow: http.HTTPFlow, op: Operation) -> str:
    """The catalog's name for the endpoint a flow went to: host, port and the endpoint's path template."""
    req = flow.request
    return f"{op.api} {canonical_host(req.host)}:{req.port}{op.path.template}"


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
    flow.metadata[LISTING] = (endpoint_of(flow, op), doc["id"], first)


def learn(flow: http.HTTPFlow, catalog: ToolCatalog) -> None:
    noted = flow.metadata.pop(LISTING, None)
    resp = flow.response
    if noted is None or resp is None or resp.status_code // 100 != 2:
        return
    endpoint, call_id, first = noted
    try:
        body = resp.content or b""
    except ValueError:  # a Content-Encoding mitmproxy cannot undo: nothing learnt
        return
    found = response_for(body, resp.headers.get("content-type"), call_id)
    if found is None or not isinstance(found.get("result"), dict):
        return
    n = catalog.learn(endpoint, found["result"], first_page=first)
    writes = sorted(escape_controls(name)[:64] for name, ro in catalog.tools(endpoint).items() if not ro)
    logger.info(
        f"receipt-proxy: {endpoint}: tools/list named {n} tools; writes (no readOnlyHint): "
        f"{', '.join(writes[:20]) or 'none'}{' …' if len(writes) > 20 else ''}"
    )
