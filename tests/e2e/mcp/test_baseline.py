"""
MCP tool calls through a proxy, before the addon knows MCP: the baseline the MCP support builds on.

Real parts: the MCP server of the official SDK (tests/e2e/mcp/server.py, in JSON and SSE response
modes), the SDK's own client in a subprocess (tests/e2e/mcp/client.py) in both protocol revisions
(legacy 2025-11-25 and the default 2026-07-28), and a real mitmdump between them, found by the
client through HTTP_PROXY.

- Through a bare mitmdump (no receipts addon): a call succeeds and makes one effect; a
  commit-then-drop reaches the client as an error, and the same call again makes a SECOND effect
  (the problem issue 15 describes); the other faults show the shapes the addon will classify.
- Through the receipts addon with rules that match no MCP request (tests/rules_it, whose host is
  127.0.0.1 but whose paths are not /mcp): every MCP message passes
  untouched, in both revisions and both modes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_RULES
from tests.e2e.mcp.client import REVISIONS, run_client
from tests.e2e.processes import Proxy

ISSUE = {"title": "Printer on fire", "body": "Third floor"}


@pytest.fixture(scope="module")
def receipts_proxy(tmp_path_factory, confdir):
    """
    The receipts addon with tests/rules_it, whose host is 127.0.0.1 but whose paths are not /mcp:
    rules that match no MCP message. (tests/e2e/mcp/test_mcp.py passes MCP messages through rules that do
    name the endpoint.)
    """
    proxy = Proxy(tmp_path_factory.mktemp("mcp-receipts"), confdir, rules=TEST_RULES).start()
    yield proxy
    proxy.stop()


def mcp_receipts(proxy: Proxy) -> list:
    """The proxy's receipts for the MCP endpoint (a DB not created yet has none)."""
    from proxy_addon.store import Store

    if not Path(proxy.db).exists():
        return []
    store = Store.open(proxy.db, create=False)
    try:
        return [r for r in store.list(limit=None) if "/mcp" in r.target]
    finally:
        store.close()


def ok_calls(report: dict) -> list[dict]:
    assert "connect_error" not in report, report
    return report["results"]


def text_of(result: dict) -> str:
    return "".join(c.get("text", "") for c in result.get("content") or [])


# --- through a bare mitmdump -------------------------------------------------------------------


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_call_through_a_bare_proxy_makes_one_effect(mcp_server, bare_mitmdump, revision):
    report = run_client(
        mcp_server.url,
        [("list_tools",), ("call", "create_issue", ISSUE)],
        revision=revision,
        proxy=bare_mitmdump.url,
        ca=bare_mitmdump.ca,
        timeout=5,
    )
    listed, created = ok_calls(report)
    assert report["protocol_version"] == ("2025-11-25" if revision == "legacy" else "2026-07-28")
    tools = {t["name"]: t["annotations"] for t in listed["tools"]}
    assert tools["create_issue"]["readOnlyHint"] is False
    assert tools["list_issues"]["readOnlyHint"] is True and tools["get_issue"]["readOnlyHint"] is True
    assert created["ok"] and not created["is_error"], created
    assert created["structured"] == {"number": 1, **ISSUE}
    effects = mcp_server.effects()
    assert effects["created"] == 1
    # The calls went through the proxy (the client was told only HTTP_PROXY): the server saw them.
    [call] = mcp_server.calls("create_issue")
    assert call["arguments"] == ISSUE
    if revision == "legacy":
        assert call["headers"]["mcp-session-id"] and "mcp-method" not in call["headers"]
    else:
        assert call["headers"]["mcp-method"] == "tools/call" and call["headers"]["mcp-name"] == "create_issue"
        assert "mcp-session-id" not in call["headers"]
    # The wire format tests/e2e/mcp/server.py's docstring describes, as the server sent it.
    answer = call["response"]
    assert answer["status"] == 200
    if mcp_server.mode == "sse":
        assert answer["content_type"] == "text/event-stream"
        events = [e for e in answer["body"].split("\r\n\r\n") if e.startswith("event: message\r\ndata: ")]
        assert len(events) == 1, answer["body"]
        message = json.loads(events[0].removeprefix("event: message\r\ndata: "))
    else:
        assert answer["content_type"] == "application/json"
        message = json.loads(answer["body"])
    assert message["id"] == call["id"] and message["result"]["structuredContent"] == {"number": 1, **ISSUE}
    assert ("resultType" in message["result"]) == (revision != "legacy")  # "complete" in 2026-07-28 only


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_retry_after_a_dropped_answer_makes_a_second_effect(mcp_server, bare_mitmdump, revision):
    """The problem: the client cannot tell a lost answer from a failed call, and its retry writes again."""
    mcp_server.queue("commit_then_drop")
    report = run_client(
        mcp_server.url,
        [("call", "create_issue", ISSUE), ("call", "create_issue", ISSUE)],
        revision=revision,
        proxy=bare_mitmdump.url,
        ca=bare_mitmdump.ca,
        timeout=5,
    )
    dropped, retried = ok_calls(report)
    # mitmproxy answers the cut connection with a 502; the SDK turns any status >= 400 without a
    # JSON-RPC body into this error.
    assert dropped["ok"] is False
    assert dropped["error"] == {"type": "MCPError", "code": -32603, "message": "Server returned an error response"}
    assert [h["status"] for h in report["http"] if h["jsonrpc_method"] == "tools/call"] == [502, 200]
    assert retried["ok"] and not retried["is_error"]
    assert retried["structured"]["number"] == 2
    effects = mcp_server.effects()
    assert effects["created"] == 2, "the retry made a second effect"
    assert [i["title"] for i in effects["issues"]] == [ISSUE["title"]] * 2
    first, second = mcp_server.calls("create_issue")
    assert first["fault"] == "commit_then_drop" and second["fault"] == ""
    assert first["id"] != second["id"], "a retry is a new JSON-RPC request with a new id"


@pytest.mark.parametrize("revision", REVISIONS)
def test_the_faults_as_the_client_sees_them_through_a_bare_proxy(mcp_server, bare_mitmdump, revision):
    """tool_error, internal_error, invalid_params and commit_then_hang: what reaches the client, what was written."""
    ops = [("call", "create_issue", {**ISSUE, "fault": f}) for f in ("tool_error", "internal_error", "invalid_params")]
    mcp_server.queue("commit_then_hang")
    ops.insert(0, ("call", "create_issue", ISSUE))
    report = run_client(
        mcp_server.url, ops, revision=revision, proxy=bare_mitmdump.url, ca=bare_mitmdump.ca, timeout=1.5
    )
    hung, tool_error, internal, invalid = ok_calls(report)
    assert hung["error"] == {"type": "MCPError", "code": -32001, "message": "Request 'tools/call' timed out"}
    if revision == "legacy":  # the legacy client says it gave up; the 2026 one closes the POST's connection
        cancelled = [r for r in mcp_server.effects()["requests"] if r["jsonrpc_method"] == "notifications/cancelled"]
        assert len(cancelled) == 1 and '"requestId"' in cancelled[0]["body"]
    assert tool_error["ok"] and tool_error["is_error"] is True
    assert "fault tool_error" in text_of(tool_error)
    assert internal["error"]["code"] == -32603 and "internal error after commit" in internal["error"]["message"]
    assert invalid["error"]["code"] == -32602
    # hang and internal_error recorded the issue; tool_error and invalid_params did not
    assert mcp_server.effects()["created"] == 2


# --- through the receipts addon, rules that match no MCP message -------------------------------


@pytest.mark.parametrize("revision", REVISIONS)
def test_mcp_passes_the_addon_untouched_when_no_rule_matches(mcp_server, receipts_proxy, revision):
    ops = [
        ("list_tools",),
        ("call", "create_issue", ISSUE),
        ("call", "create_issue", ISSUE),
        ("call", "list_issues", {}),
        ("call", "get_issue", {"number": 1}),
    ]
    report = run_client(
        mcp_server.url, ops, revision=revision, proxy=receipts_proxy.url, ca=receipts_proxy.ca, timeout=5
    )
    listed, first, second, listing, got = ok_calls(report)
    assert report["protocol_version"] == ("2025-11-25" if revision == "legacy" else "2026-07-28")
    assert {t["name"] for t in listed["tools"]} == {
        "create_issue",
        "log_issue",
        "list_issues",
        "get_issue",
        "confirm_issue",
        "drafted_issue",
        "rooted_issue",
        "reported_issue",
        "create_issue_confirmed",
        "ask_forever",
        "create_issue_later",
    }
    assert [first["structured"]["number"], second["structured"]["number"]] == [1, 2], "no rule: both calls go out"
    assert listing["structured"] == {"issues": [{"number": 1, **ISSUE}, {"number": 2, **ISSUE}]}
    assert got["structured"] == {"number": 1, **ISSUE}
    assert mcp_server.effects()["created"] == 2
    # Nothing was a write to the addon: no receipt header on any answer, and the handshake went through.
    assert all(h["status"] in (200, 202) for h in report["http"] if h["method"] == "POST"), report["http"]
    methods = [r["jsonrpc_method"] for r in mcp_server.effects()["requests"]]
    assert methods[0] == ("initialize" if revision == "legacy" else "server/discover")
    if revision == "legacy":
        assert "notifications/initialized" in methods
        assert any(r["http_method"] == "DELETE" for r in mcp_server.effects()["requests"])
    assert mcp_receipts(receipts_proxy) == []


# --- over https: the proxy intercepts TLS, the client trusts mitmproxy's CA through SSL_CERT_FILE ----


@pytest.fixture(scope="module")
def mcp_tls_server(tmp_path_factory):
    from tests.e2e.mcp.fixtures import McpServer

    with McpServer("json", tmp_path_factory.mktemp("mcp-tls"), tls=True) as server:
        yield server


@pytest.mark.parametrize("revision", REVISIONS)
def test_https_through_a_bare_proxy_and_through_the_addon(mcp_tls_server, tmp_path, confdir, revision):
    from tests.e2e.mcp.fixtures import BareMitmdump

    mcp_tls_server.reset()
    assert mcp_tls_server.url.startswith("https://")
    bare = BareMitmdump(tmp_path, confdir, upstream_ca=mcp_tls_server.cert_path).start()
    addon = Proxy(tmp_path, confdir, upstream_ca=mcp_tls_server.cert_path).start()  # tests/rules_it: 127.0.0.1
    try:
        for proxy in (bare, addon):
            report = run_client(
                mcp_tls_server.url,
                [("list_tools",), ("call", "create_issue", ISSUE)],
                revision=revision,
                proxy=proxy.url,
                ca=proxy.ca,
                timeout=5,
            )
            listed, created = ok_calls(report)
            assert listed["ok"] and created["ok"] and not created["is_error"], report["results"]
            assert report["http"][0]["url"].startswith("https://127.0.0.1:")
    finally:
        bare.stop()
        addon.stop()
    assert mcp_tls_server.effects()["created"] == 2
    assert mcp_receipts(addon) == []


# --- what the SDK client accepts as an answer: what the addon's own answers must look like -----

LISTED: dict[str, list] = {"issues": []}
TEXT = [{"type": "text", "text": json.dumps(LISTED)}]
DONE = {"content": TEXT, "structuredContent": LISTED, "isError": False, "resultType": "complete"}
# (name, canned answer, what the client reports: "ok", "is_error", or an error's (type, code, words))
Reported = str | tuple[str, int | None, str]
ANSWERS: list[tuple[str, dict[str, Any], Reported | dict[str, Reported]]] = [
    ("complete", {"message": {"result": DONE}}, "ok"),
    (
        "no resultType",
        {"message": {"result": {k: v for k, v in DONE.items() if k != "resultType"}}},
        {"legacy": "ok", "2026-07-28": ("ValidationError", None, "resultType")},
    ),
    ("sse framing", {"message": {"result": DONE}, "framing": "sse"}, "ok"),
    ("sse, another id", {"message": {"result": DONE}, "framing": "sse", "id": 999}, "ok"),  # SSE: id rewritten
    (
        "no structuredContent",
        {"message": {"result": {"content": TEXT, "isError": False, "resultType": "complete"}}},
        ("RuntimeError", None, "output schema"),
    ),
    (
        "isError",
        {
            "message": {
                "result": {
                    "content": [{"type": "text", "text": "a duplicate"}],
                    "isError": True,
                    "resultType": "complete",
                }
            }
        },
        "is_error",
    ),
    (
        "409 with a JSON-RPC error",
        {"message": {"error": {"code": -32001, "message": "a duplicate"}}, "status": 409},
        ("MCPError", -32001, "a duplicate"),
    ),
    (
        "409 without one",
        {"message": {"note": "refused"}, "status": 409},
        ("MCPError", -32603, "Server returned an error response"),
    ),
    ("json, another id", {"message": {"result": DONE}, "id": 999}, ("MCPError", -32001, "timed out")),
    ("json, the id as a string", {"message": {"result": DONE}, "id": "$string"}, "ok"),  # "3" answers 3
]


@pytest.mark.parametrize("revision", REVISIONS)
def test_what_the_sdk_client_accepts_as_a_tool_result(mcp_json_server, revision):
    """
    Hand-made answers to tools/call (the server's /_canned), straight to the server: the rules the
    addon's own answers (a replay, a blocked duplicate) must follow. 2026-07-28 needs
    `"resultType": "complete"`; JSON answers must carry the request's id (the SDK takes "3" for 3),
    while the SSE path puts the request's id into any response it reads; a tool that declares
    an outputSchema needs structuredContent unless isError; a JSON-RPC error at HTTP 409 reaches the
    caller as that error, any other 4xx as -32603.
    """
    mcp_json_server.reset()
    for _, canned, _ in ANSWERS:
        mcp_json_server.can(**canned)
    ops: list[tuple] = [("call", "list_issues", {})] * len(ANSWERS)
    report = run_client(mcp_json_server.url, ops, revision=revision, timeout=1.0)
    for (name, _, expected), got in zip(ANSWERS, ok_calls(report), strict=True):
        expected = expected[revision] if isinstance(expected, dict) else expected
        if expected == "ok":
            assert got["ok"] and not got["is_error"] and got["structured"] == LISTED, (name, got)
        elif expected == "is_error":
            assert got["ok"] and got["is_error"] and text_of(got) == "a duplicate", (name, got)
        else:
            assert isinstance(expected, tuple), expected
            kind, code, words = expected
            assert not got["ok"], (name, got)
            assert (got["error"]["type"], got["error"]["code"]) == (kind, code), (name, got)
            assert words in got["error"]["message"], (name, got)
    assert mcp_json_server.effects()["created"] == 0
