"""
What a JSON-RPC error in a tool call's answer means (outcome/tool_outcomes.py), without a proxy: an
operation's own classify rule on the code comes first, and -32600 (invalid request) proves a refusal only
without an id. Every code in every framing through a real proxy: tests/e2e/mcp/test_errors.py.
"""

from __future__ import annotations

import json

import pytest

OWN_RULES = """
api: tracker
hosts: [mcp.example]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
  issues.sample:
    match: {method: POST, path: /mcp, mcp: {tool: summarize_and_file}}
    classify:
      # this tool samples with tools after it writes: the SDK's -32602 may come after its effect
      - body: {error.code: -32602}
        state: outcome_unknown
"""


@pytest.mark.parametrize("framing, status", [("json", 200), ("json", 400), ("sse", 200)])
def test_an_operations_classify_rule_on_the_code_comes_first(framing, status):
    from proxy_addon.outcome.tool_outcomes import tool_outcome
    from proxy_addon.rules import RuleSet, load_rules
    from proxy_addon.wire.jsonrpc import framed

    rules = RuleSet.of([load_rules(OWN_RULES, "mcp.yaml")])
    ctype, body = framed({"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "no"}}, sse=framing == "sse")
    for op, state in (("issues.create", "rejected"), ("issues.sample", "outcome_unknown")):
        operation = rules.operation("tracker", op)
        assert operation is not None
        got = tool_outcome(status, "", {"content-type": ctype}, body, operation, None, 7)
        assert got.state == state, (op, got.reason)


def test_invalid_request_proves_a_refusal_only_without_an_id():
    from proxy_addon.outcome.tool_outcomes import tool_outcome
    from proxy_addon.rules import RuleSet, load_rules

    op = RuleSet.of([load_rules(OWN_RULES, "mcp.yaml")]).operation("tracker", "issues.create")
    assert op is not None
    for status in (200, 400):
        for rid, state in ((None, "rejected"), (7, "outcome_unknown")):
            message: dict[str, object] = {"jsonrpc": "2.0", "error": {"code": -32600, "message": "bad"}}
            if rid is not None:
                message["id"] = rid
            body = json.dumps(message).encode()
            got = tool_outcome(status, "", {"content-type": "application/json"}, body, op, None, 7)
            assert got.state == state, (status, rid, got.reason)
        # an error without an id counts in a JSON answer, which holds one message: not in a list of several
        listed = json.dumps([{"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "bad"}}]).encode()
        got = tool_outcome(status, "", {"content-type": "application/json"}, listed, op, None, 7)
        assert got.state == ("outcome_unknown" if status == 200 else "rejected")
