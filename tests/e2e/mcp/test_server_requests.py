"""
What an MCP server sends the client while a tool call runs, through the proxy, with the official
SDK's server (tests/e2e/mcp/server.py, SSE mode) and client (tests/e2e/mcp/client.py) in the 2025-11-25
revision, where the server's own requests travel on the call's event stream (issue 25, item 2):

- an elicitation request ("Create the issue?"): it reaches the client's elicitation callback,
  the client's answer (a POST of a JSON-RPC response) passes to the server untouched and makes
  no receipt, the tool completes: one issue, the receipt succeeded, a retry replayed without
  asking again (before: the question was held with the answer, the client timed out, -32001,
  and the receipt was outcome_unknown); declined: the tool's error, rejected, no issue;
- a sampling request and a roots/list request, on the call's stream and on the session's GET
  stream (where the SDK's ctx.session.list_roots() sends it): answered by the client's callbacks;
- progress and log notifications reach the client's callbacks while the call runs: the tool
  finishes only once the client has its last progress notification (released: true);
- the client's answers pass whatever they hold: keys that differ only by case in an elicitation's
  content (the strict JSON rules refuse them in a request, never in a response), and a
  notifications/cancelled, which the server takes (202).

JSON mode has no channel for any of this (the SDK's server drops notifications and refuses to send
a request of its own in it: the tool fails with -32600, which is no refusal when the tool had written
before it asked), nor has 2026-07-28, whose elicitation is an `input_required` result (item 1); its
progress notifications are tested here, in SSE mode.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import recorded_answer, wait_for
from tests.e2e.mcp.client import run_client
from tests.e2e.mcp.test_mcp import events, receipts
from tests.e2e.processes import Proxy

TOOLS = ("confirm_issue", "drafted_issue", "rooted_issue", "reported_issue")
RULES = 'api: tracker\nhosts: ["127.0.0.1"]\noperations:\n' + "".join(
    f"  issues.{tool}:\n    match: {{method: POST, path: /mcp, mcp: {{tool: {tool}}}}}\n"
    f"    fingerprint: {{body: [params.arguments.title]}}\n    external_id: number\n"
    for tool in TOOLS
)
TIMEOUT = 5.0  # the client's read timeout: an answer held by the proxy makes the call fail (-32001)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("mcp-server-requests")
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(workdir, confdir, rules=rules)
    try:
        yield p.start()
    finally:
        p.stop()


@pytest.fixture
def server(mcp_sse_server):
    mcp_sse_server.reset()
    return mcp_sse_server


def title() -> str:
    return f"Printer on fire {uuid.uuid4().hex[:8]}"


def the_receipt(proxy: Proxy, name: str):
    found = receipts(proxy, name)
    assert len(found) == 1, found
    return found[0]


def run(server, proxy: Proxy, *ops: tuple, revision: str = "legacy", **how) -> dict:
    report = run_client(server.url, list(ops), revision=revision, proxy=proxy.url, ca=proxy.ca, timeout=TIMEOUT, **how)
    assert "connect_error" not in report, report
    assert report["protocol_version"] == ("2025-11-25" if revision == "legacy" else "2026-07-28"), report
    return report


def answers_posted(server) -> list[dict]:
    """The POSTs the server got that carry no method: the client's answers to its own requests."""
    return [r for r in server.effects()["requests"] if r["http_method"] == "POST" and r["jsonrpc_method"] is None]


def test_an_elicitation_reaches_the_client_and_its_answer_the_tool(server, proxy):
    args = {"title": title(), "body": "Third floor"}
    yes = {"action": "accept", "content": {"confirm": True, "note": "the user said yes"}}
    before = len(receipts(proxy))
    report = run(
        server, proxy, ("call", "confirm_issue", args), ("call", "confirm_issue", args), answers={"elicit": yes}
    )
    first, retry = report["results"]
    assert first["ok"] and not first["is_error"], first
    assert first["structured"]["body"] == "Third floor / the user said yes"
    # The question reached the client once, during the first call; the retry was not asked again.
    assert report["asked"] == [{"kind": "elicit", "op": 0, "message": f"Create the issue {args['title']!r}?"}]
    assert retry["ok"] and retry["structured"] == first["structured"]
    effects = server.effects()
    assert effects["created"] == 1 and len(server.calls("confirm_issue")) == 1
    # The client's answer reached the server as the client sent it, and made no receipt.
    [answer] = answers_posted(server)
    assert '"action":"accept"' in answer["body"].replace(" ", "") and answer["response"]["status"] == 202
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "succeeded" and receipt.external_id == str(first["structured"]["number"])
    assert "replayed" in events(proxy, receipt.operation_id)
    assert len(receipts(proxy)) == before + 1  # the call's alone: the answer made none
    assert recorded_answer(proxy.db, receipt).body.count(b"data:") == 1  # the result's event, not the question's


def test_a_declined_elicitation_is_the_tools_refusal(server, proxy):
    """The user says no: the tool reports an error and makes nothing (rejected); the retry is sent, and asks again."""
    args = {"title": title(), "body": "Roof"}
    no = {"action": "decline"}
    report = run(
        server, proxy, ("call", "confirm_issue", args), ("call", "confirm_issue", args), answers={"elicit": no}
    )
    for result in report["results"]:
        assert result["ok"] and result["is_error"] and "not confirmed: decline" in result["content"][0]["text"], result
    assert [(a["kind"], a["op"]) for a in report["asked"]] == [("elicit", 0), ("elicit", 1)]
    assert server.effects()["created"] == 0 and len(server.calls("confirm_issue")) == 2
    assert [r.state for r in receipts(proxy, args["title"])] == ["rejected", "rejected"]


@pytest.mark.parametrize("channel", ["call", "session"])
def test_a_sampling_request_and_a_roots_request_reach_the_client_during_the_call(server, proxy, channel):
    drafted, rooted = {"title": title(), "channel": channel}, {"title": title(), "channel": channel}
    before = len(receipts(proxy))
    report = run(
        server,
        proxy,
        ("call", "drafted_issue", drafted),
        ("call", "rooted_issue", rooted),
        answers={"sample": "Smoke on the third floor", "roots": ["file:///srv/repo", "file:///srv/docs"]},
    )
    sampled, listed = report["results"]
    assert sampled["ok"] and not sampled["is_error"], sampled
    assert sampled["structured"]["body"] == "Smoke on the third floor"
    assert listed["ok"] and not listed["is_error"], listed
    assert listed["structured"]["body"] == "file:///srv/repo file:///srv/docs"
    assert [(a["kind"], a["op"]) for a in report["asked"]] == [("sample", 0), ("roots", 1)]
    assert server.effects()["created"] == 2 and len(answers_posted(server)) == 2
    for args, result in ((drafted, sampled), (rooted, listed)):
        receipt = the_receipt(proxy, args["title"])
        assert receipt.state == "succeeded" and receipt.external_id == str(result["structured"]["number"])
    assert len(receipts(proxy)) == before + 2  # the calls' alone: the answers made none


@pytest.mark.parametrize("revision", ["legacy", "2026-07-28"])
def test_progress_and_log_notifications_reach_the_client_while_the_call_runs(server, proxy, revision):
    args: dict[str, Any] = {"title": title(), "steps": 3}
    report = run(
        server,
        proxy,
        ("call", "reported_issue", args),
        ("call", "reported_issue", args),
        revision=revision,
        log_level="info",
        release=server.base + "/_release",
    )
    first, retry = report["results"]
    assert first["ok"] and not first["is_error"], first
    assert first["progress"] == [[i, 3, f"step {i} of 3"] for i in (1, 2, 3)]
    # The tool ended only once the client had its last progress notification: it was not held.
    assert first["structured"]["released"] is True
    assert report["logs"] == [{"level": "info", "data": f"starting {args['title']}", "op": 0}]
    assert retry["ok"] and retry["structured"] == first["structured"] and retry["progress"] == []
    assert server.effects()["created"] == 1
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "succeeded" and "replayed" in events(proxy, receipt.operation_id)
    recorded = recorded_answer(proxy.db, receipt).body
    assert recorded.count(b"data:") == 1 and b"notifications/" not in recorded


def test_an_answer_with_keys_that_differ_by_case_passes_to_the_tool(server, proxy):
    """The strict JSON rules refuse such keys in a request (a tool call's arguments), never in the client's answer."""
    args = {"title": title(), "body": "Basement"}
    yes = {"action": "accept", "content": {"confirm": True, "note": "lower", "Note": "upper"}}
    before = len(receipts(proxy))
    report = run(server, proxy, ("call", "confirm_issue", args), answers={"elicit": yes})
    [result] = report["results"]
    assert result["ok"] and not result["is_error"], result
    assert result["structured"]["body"] == "Basement / lower"
    [answer] = answers_posted(server)
    assert '"Note"' in answer["body"] and answer["response"]["status"] == 202
    assert server.effects()["created"] == 1
    assert the_receipt(proxy, args["title"]).state == "succeeded" and len(receipts(proxy)) == before + 1


def test_the_clients_cancellation_passes_to_the_server(server, proxy):
    """
    A client whose read timeout passes sends notifications/cancelled: it passes untouched (202), makes no
    receipt, and the server stops the tool, and answers the call -32800 on its stream or ends it without an
    answer (the SDK's server does either): outcome_unknown both ways, since a cancelled tool may have run
    (here it had not: no issue).
    """
    args: dict[str, Any] = {
        "title": title(),
        "steps": 1,
        "hold": 30.0,
    }  # never released: the client's timeout passes first
    before = len(receipts(proxy))
    # Then a call the session waits for: closed at once, the session could end before the cancellation lands.
    report = run_client(
        server.url,
        [("call", "reported_issue", args), ("call", "get_issue", {"number": 1})],
        revision="legacy",
        proxy=proxy.url,
        ca=proxy.ca,
        timeout=1.5,
    )
    result = report["results"][0]
    assert not result["ok"] and result["error"]["code"] == -32001, result
    [call] = server.calls("reported_issue")
    cancelled = [r for r in server.effects()["requests"] if r["jsonrpc_method"] == "notifications/cancelled"]
    assert [(json.loads(r["body"])["params"]["requestId"], r["response"]["status"]) for r in cancelled] == [
        (call["id"], 202)
    ]
    receipt = wait_for(
        lambda: next((r for r in receipts(proxy, args["title"]) if r.state != "submitted"), None),
        timeout=20,
        what="the call's outcome",
    )
    assert receipt.state == "outcome_unknown", (receipt.state, receipt.error)
    assert len(receipts(proxy)) == before + 1 and server.effects()["created"] == 0


def test_in_json_mode_a_tool_that_wrote_then_asks_fails_and_is_not_taken_as_refused(mcp_json_server, proxy):
    """
    A JSON body has no room for a request of the server's: the SDK's server raises NoBackChannelError inside
    the running tool, a JSON-RPC error -32600 (invalid request) sent after the tool's first write. That code
    is no proof the call was refused before it ran: outcome_unknown, and the retry is blocked.
    """
    mcp_json_server.reset()
    args: dict[str, Any] = {"title": title(), "body": "draft", "draft": True}
    yes = {"action": "accept", "content": {"confirm": True}}
    first, retry = run(
        mcp_json_server,
        proxy,
        ("call", "confirm_issue", args),
        ("call", "confirm_issue", args),
        answers={"elicit": yes},
    )["results"]
    assert not first["ok"] and first["error"]["code"] == -32600 and "back-channel" in first["error"]["message"]
    assert mcp_json_server.effects()["created"] == 1 and len(mcp_json_server.calls("confirm_issue")) == 1
    receipt = the_receipt(proxy, args["title"])
    assert receipt.state == "outcome_unknown", (receipt.state, receipt.error)
    assert retry["ok"] and retry["is_error"] and retry["content"][0]["text"].startswith("NOT SENT"), retry
