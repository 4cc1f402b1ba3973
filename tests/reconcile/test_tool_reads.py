"""
The revision of a tool call, for its reconcile read (reconcile/tool_reads.py), without a server: read from
the call (its MCP-Protocol-Version header, else its `_meta`), noted with the intent and never
fingerprinted. Reads against real servers of each revision: tests/e2e/mcp/test_reads.py.
"""

from __future__ import annotations

import json

import pytest

from proxy_addon.intent.fingerprint import RequestView, fingerprint
from proxy_addon.rules import RuleSet, load_rules

MODERN, LEGACY = "2026-07-28", "2025-11-25"


NOTE_RULES = """
api: tracker
hosts: [mcp.example]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title]}
"""


@pytest.mark.parametrize(
    "headers, meta, noted",
    [
        ({"mcp-protocol-version": LEGACY}, None, LEGACY),
        ({"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "create_issue"}, MODERN, MODERN),
        ({}, MODERN, MODERN),  # stdio-like: the body's _meta alone
        ({"mcp-protocol-version": "Bearer sk-live-1"}, None, None),  # not a revision: never stored
        ({}, None, None),
    ],
    ids=["legacy-header", "modern", "meta-only", "not-a-date", "none"],
)
def test_the_calls_revision_is_noted_with_its_intent_and_never_fingerprinted(headers, meta, noted):
    rules = RuleSet.of([load_rules(NOTE_RULES, "mcp.yaml")])
    params: dict = {"name": "create_issue", "arguments": {"title": "t"}}
    if meta:
        params["_meta"] = {"io.modelcontextprotocol/protocolVersion": meta}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
    sent = {"content-type": "application/json", **headers}
    m = rules.match("mcp.example", 443, "POST", "/mcp", body=body, headers=list(sent.items()))
    assert m is not None
    got = fingerprint(m, RequestView("POST", "https", "mcp.example", 443, "/mcp", sent, body), b"k" * 32)
    assert got.intent.get("mcp_revision") == noted
    assert "sk-live" not in json.dumps(got.intent)
    bare = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
        b'"params": {"name": "create_issue", "arguments": {"title": "t"}}}'
    )
    plain = {"content-type": "application/json"}
    m0 = rules.match("mcp.example", 443, "POST", "/mcp", body=bare, headers=list(plain.items()))
    assert m0 is not None
    assert (
        fingerprint(m0, RequestView("POST", "https", "mcp.example", 443, "/mcp", plain, bare), b"k" * 32).fingerprint
        == got.fingerprint
    ), "a retry in another revision is the same write"
