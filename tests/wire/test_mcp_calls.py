"""The MCP core without a proxy: tool calls read from bodies, answers classified, the proxy's answers shaped."""

from __future__ import annotations

import base64
import json
import re

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.explain import explain, render
from proxy_addon.intent.fingerprint import RequestView, fingerprint
from proxy_addon.outcome.http_answers import Answer, json_answer
from proxy_addon.outcome.tool_answers import as_tool_answer
from proxy_addon.outcome.tool_outcomes import tool_outcome
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.states import State
from proxy_addon.wire.jsonrpc import messages_of, response_for, wants_sse
from proxy_addon.wire.mcp_calls import Refused, ToolCall, read_call

KEY = b"k" * 32

RULES = """
api: tracker
hosts: [mcp.example]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
  files.write:
    match: {method: POST, path: /mcp, mcp: {tool: file_write, arguments: {mode: create}}}
  comments.add:
    match: {method: POST, path: /mcp, mcp: {tool: add_comment}}
    classify:
      - body: {text: {contains: already exists}}
        state: already_exists
    reconcile:
      read: {method: GET, url: /comments}
      find: {body: "{external_id}"}
"""


def call_body(name: str, arguments: object = None, id_: object = 1, **extra: object) -> bytes:
    params: dict = {"name": name, **extra}
    if arguments is not None:
        params["arguments"] = arguments
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}).encode()


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return RuleSet.of([load_rules(RULES, "mcp.yaml")])


def match(rules: RuleSet, body: bytes, headers: list[tuple[str, str]] | None = None):
    return rules.match("mcp.example", 443, "POST", "/mcp", body=body, headers=headers or [])


def test_a_tool_call_matches_its_tool_and_argument_values(rules):
    assert rules.match("mcp.example", 443, "POST", "/mcp").pending  # the body decides
    m = match(rules, call_body("create_issue", {"title": "t"}, id_="abc"))
    assert m.operation.name == "issues.create" and m.mcp_call == ToolCall("abc", "create_issue", {"title": "t"})
    assert match(rules, call_body("file_write", {"mode": "create", "path": "a"})).operation.name == "files.write"
    assert match(rules, call_body("file_write", {"mode": "update", "path": "a"})) is None
    assert match(rules, call_body("list_issues", {})) is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}',
        b'{"jsonrpc":"2.0","id":7,"result":{}}',
    ],
    ids=["initialize", "tools-list", "notification", "discover", "a-response"],
)
def test_other_messages_are_not_tool_calls(rules, body):
    assert match(rules, body) is None


def test_a_body_that_is_not_json_is_refused(rules):
    """Before issue 24 it passed untouched; a server that reads it otherwise (tests/lenient_json.py) ran it."""
    m = match(rules, b"not json")
    assert (m.refused_as, m.refused) == ("bad_json", "the JSON-RPC body is not JSON (Expecting value at offset 0)")


def test_routing_headers_must_agree_with_the_body(rules):
    body = call_body("create_issue", {"title": "t"})
    assert match(rules, body, [("Mcp-Method", "tools/call"), ("Mcp-Name", "create_issue")]).mcp_call.modern
    encoded = "=?base64?" + base64.b64encode(b"create_issue").decode() + "?="
    assert match(rules, body, [("Mcp-Name", encoded)]).refused is None
    assert "Mcp-Name" in match(rules, body, [("Mcp-Name", "list_issues")]).refused
    assert "Mcp-Method" in match(rules, body, [("Mcp-Method", "tools/list")]).refused
    # a harmless body under headers that name a write is refused too: the two would be two different calls
    listing = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    assert "Mcp-Method" in match(rules, listing, [("Mcp-Method", "tools/call")]).refused


def test_a_batch_holding_a_tool_call_is_refused(rules):
    batch = b"[" + call_body("create_issue", {"title": "t"}) + b"," + b'{"jsonrpc":"2.0","id":2,"method":"ping"}]'
    assert "batch" in match(rules, batch).refused
    assert match(rules, b'[{"jsonrpc":"2.0","id":2,"method":"ping"}]') is None


@pytest.mark.parametrize(
    "body, why",
    [
        (call_body("create_issue", ["t"]), "not an object"),
        (
            json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "x"}}).encode(),
            "without a JSON-RPC id",
        ),
        (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}).encode(), "without a tool name"),
    ],
    ids=["arguments-list", "no-id", "no-name"],
)
def test_malformed_tool_calls_are_refused(body, why):
    call = read_call(json.loads(body), {})
    assert isinstance(call, Refused) and why in call.why


def test_the_id_and_session_never_enter_the_fingerprint(rules):
    def intent(body: bytes, session: str):
        m = match(rules, body)
        headers = {"content-type": "application/json", "mcp-session-id": session}
        view = RequestView("POST", "https", "mcp.example", 443, "/mcp", headers, body)
        return fingerprint(m, view, KEY)

    a = intent(call_body("create_issue", {"title": "t", "body": "b"}, id_=1), "s1")
    b = intent(call_body("create_issue", {"body": "b", "title": "t"}, id_="retry-2"), "s2")
    c = intent(call_body("create_issue", {"title": "t", "body": "other"}, id_=1), "s1")
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert a.intent["tool"] == "create_issue"
    assert a.intent["body"] == {"params.arguments.title": "t", "params.arguments.body": "b"}
    assert "s1" not in json.dumps(a.intent) and "retry-2" not in json.dumps(b.intent)


def test_without_named_fields_every_argument_enters_and_credentials_are_hashed(rules):
    body = call_body("file_write", {"mode": "create", "path": "a.txt", "api_key": "sk-live-SECRET", "meta": {"x": 1}})
    m = match(rules, body)
    view = RequestView("POST", "https", "mcp.example", 443, "/mcp", {"content-type": "application/json"}, body)
    got = fingerprint(m, view, KEY)
    assert got.intent["body"]["params.arguments.path"] == "a.txt"
    assert "SECRET" not in json.dumps(got.intent)
    assert set(got.intent["hashed"]) == {"params.arguments.api_key", "params.arguments.meta"}


@pytest.mark.parametrize(
    "text",
    [
        "fingerprint: {body: [id]}",
        "fingerprint: {body: [params._meta.x]}",
    ],
    ids=["jsonrpc-id", "meta"],
)
def test_an_mcp_fingerprint_names_arguments_only(text):
    rules = f"""
api: t
hosts: [h.example]
operations:
  a:
    match: {{method: POST, path: /mcp, mcp: {{tool: t}}}}
    {text}
"""
    with pytest.raises(RulesError, match=r"params\.arguments"):
        load_rules(rules, "t.yaml")


def test_mcp_match_needs_post_and_a_tool_name():
    rules = """
api: t
hosts: [h.example]
operations:
  a:
    match: {method: GET, path: /mcp, mcp: {tool: t}}
"""
    with pytest.raises(RulesError, match="use method: POST"):
        load_rules(rules, "t.yaml")


SSE = (
    b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n\n'
    b'id: 4\nevent: message\ndata: {"jsonrpc":"2.0","id":9,\ndata: '
    b'"result":{"content":[{"type":"text","text":"ok"}]}}\n\n'
)


def test_the_response_with_the_calls_id_is_found_in_json_and_event_streams():
    found = response_for(SSE, "text/event-stream", 9)
    assert found is not None and found["result"]["content"][0]["text"] == "ok"
    assert response_for(SSE, "text/event-stream", "9") is None  # "9" is not 9
    assert len(messages_of(SSE.replace(b"\n", b"\r\n"), "text/event-stream; charset=utf-8")) == 2
    assert response_for(b'{"jsonrpc":"2.0","id":"a","result":{}}', "application/json", "a") == {
        "jsonrpc": "2.0",
        "id": "a",
        "result": {},
    }


def outcome(rules, message: dict | bytes, *, status: int = 200, sse: bool = False, op: str = "issues.create"):
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    if sse:
        body = b"event: message\ndata: " + body + b"\n\n"
    ctype = "text/event-stream" if sse else "application/json"
    return tool_outcome(status, "OK", {"content-type": ctype}, body, rules.operation("tracker", op), None, 5)


def result(content: str, **more: object) -> dict:
    return {"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": content}], **more}}


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_tool_answers_are_classified(rules, sse):
    ok = outcome(rules, result('{"number": 12}'), sse=sse)
    assert ok.state is State.SUCCEEDED and ok.external_id == "12"
    assert outcome(rules, result("x", structuredContent={"number": 7}), sse=sse).external_id == "7"
    assert outcome(rules, result("bad title", isError=True), sse=sse).state is State.REJECTED
    invalid = {"jsonrpc": "2.0", "id": 5, "error": {"code": -32602, "message": "invalid"}}
    assert outcome(rules, invalid, sse=sse).state is State.REJECTED
    internal = {"jsonrpc": "2.0", "id": 5, "error": {"code": -32603, "message": "boom"}}
    assert outcome(rules, internal, sse=sse).state is State.OUTCOME_UNKNOWN
    odd = {"jsonrpc": "2.0", "id": 5, "error": {"code": -32001, "message": "?"}}
    assert outcome(rules, odd, sse=sse).state is State.OUTCOME_UNKNOWN
    other_id = {**result("ok"), "id": 6}
    assert outcome(rules, other_id, sse=sse).state is State.OUTCOME_UNKNOWN  # not this call's answer


def test_an_http_error_is_classified_as_any_writes(rules):
    assert outcome(rules, b"{}", status=401).state is State.REJECTED
    assert outcome(rules, b"{}", status=502).state is State.OUTCOME_UNKNOWN
    assert outcome(rules, b"", status=200).state is State.OUTCOME_UNKNOWN  # a cut answer


def test_a_classify_rule_reads_the_tools_text(rules):
    exists = outcome(rules, result("comment already exists", isError=True), op="comments.add")
    assert exists.state is State.OUTCOME_UNKNOWN and exists.evidence


def test_a_blocked_duplicate_is_a_tool_error_the_model_reads():
    blocked = json_answer(
        409,
        {"error": "duplicate_unresolved", "operation_id": "r1", "state": "outcome_unknown", "hint": "h"},
        {"X-Receipt-Id": "r1", "X-Receipt-State": "outcome_unknown"},
    )
    got = as_tool_answer(blocked, ToolCall(42, "create_issue", {}, modern=True), "application/json, text/event-stream")
    assert got.status == 200
    doc = json.loads(got.body)
    assert doc["id"] == 42 and doc["result"]["isError"] is True and doc["result"]["resultType"] == "complete"
    text = doc["result"]["content"][0]["text"]
    assert "r1" in text and "outcome is unknown" in text and "NOT SENT" in text
    assert ("X-Receipt-Id", "r1") in got.headers
    legacy = json.loads(as_tool_answer(blocked, ToolCall(42, "create_issue"), "application/json").body)
    assert "resultType" not in legacy["result"]


def test_a_replay_carries_the_duplicates_id_in_the_framing_asked_for():
    recorded = Answer(
        200,
        (("Content-Type", "text/event-stream"), ("mcp-session-id", "old"), ("X-Receipt-Replayed", "true")),
        b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{"content":[]}}\n\n',
    )
    sse = as_tool_answer(recorded, ToolCall("n2", "create_issue"), "application/json, text/event-stream")
    assert sse.body.startswith(b"event: message\ndata: ") and b'"id":"n2"' in sse.body
    assert not any(k.lower() == "mcp-session-id" for k, _ in sse.headers)
    plain = as_tool_answer(recorded, ToolCall(3, "create_issue"), "application/json")
    assert json.loads(plain.body)["id"] == 3 and ("Content-Type", "application/json") in plain.headers


def test_framing_follows_accept():
    assert wants_sse("text/event-stream", False) and not wants_sse("application/json, text/event-stream", False)
    assert wants_sse("application/json, text/event-stream", True) and not wants_sse("application/json", True)


def test_a_body_with_a_key_twice_is_refused_not_guessed(rules):
    # Python's json takes the last "name", other parsers the first: the proxy would see a read, a server a write.
    twice = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        b'"params":{"name":"create_issue","name":"list_issues","arguments":{"title":"t"}}}'
    )
    m = match(rules, twice)
    assert m is not None and "twice" in m.refused and "'name'" in m.refused
    inner = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_issue","arguments":{"a":1,"a":2}}}'
    assert "twice" in match(rules, inner).refused
    assert match(rules, b'{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/list"}').refused


def test_explain_shows_what_from_server_derived_and_why_a_call_did_not_match():
    from proxy_addon.explain import explain, render

    derived = RuleSet.of(
        [load_rules(RULES.replace("operations:", "mcp: {path: /mcp, tools: from_server}\noperations:"), "mcp.yaml")]
    )
    body = call_body("delete_repo", {"name": "r", "token": "sk-SECRET"})
    report = explain(derived, "POST", "https://mcp.example/mcp", body, {"content-type": "application/json"}, KEY)
    assert report["match"]["operation"] == "from_server" and report["match"]["mcp"]["derived"]
    shown = render(report)
    assert "derived: no operation names the tool delete_repo" in shown
    assert "whatever the server's tools/list says of it: its annotations are not trusted" in shown
    assert "SECRET" not in shown  # an argument with a credential's name enters as a keyed hash
    assert "isError tool result" in shown
    rules = RuleSet.of([load_rules(RULES, "mcp.yaml")])
    missed = explain(
        rules,
        "POST",
        "https://mcp.example/mcp",
        call_body("file_write", {"mode": "update"}),
        {"content-type": "application/json"},
        KEY,
    )
    assert missed["match"] is None
    assert any("not a tools/call of file_write with mode=create" in line for line in missed["why"])


FROM_SERVER = RULES.replace(
    "operations:", "mcp: {path: /mcp, tools: from_server, read_only_tools: [list_issues]}\noperations:"
)


def test_from_server_takes_every_tool_but_the_reads_the_rules_name():
    derived = RuleSet.of([load_rules(FROM_SERVER, "mcp.yaml")])
    [op] = [o for o in derived.operations if o.name == "from_server"]
    assert (op.mcp_read_tools, op.mcp_trusts_annotations) == (("list_issues",), False)
    assert match(derived, call_body("list_issues")) is None  # named a read: none of the rules' business
    assert match(derived, call_body("get_issue", {"number": 1})).operation.name == "from_server"
    report = explain(
        derived, "POST", "https://mcp.example/mcp", call_body("list_issues"), {"content-type": "application/json"}, KEY
    )
    assert report["match"] is None
    assert any("the tool list_issues is named a read in mcp.read_only_tools" in line for line in report["why"])
    trusting = RuleSet.of(
        [load_rules(FROM_SERVER.replace("read_only_tools: [list_issues]", "annotations: trusted"), "mcp.yaml")]
    )
    shown = render(
        explain(
            trusting,
            "POST",
            "https://mcp.example/mcp",
            call_body("get_issue"),
            {"content-type": "application/json"},
            KEY,
        )
    )
    assert "declares get_issue readOnlyHint: true, in which case the call passes untouched" in shown


@pytest.mark.parametrize(
    ("mcp", "problem"),
    [
        ("{path: /mcp, tools: from_server, annotations: always}", "'always' is not one of untrusted, trusted"),
        ("{path: /mcp, annotations: trusted}", "mcp.annotations: is read only with tools: from_server"),
        ("{path: /mcp, read_only_tools: [list_issues]}", "mcp.read_only_tools: is read only with tools: from_server"),
        (
            "{path: /mcp, tools: from_server, read_only_tools: [create_issue]}",
            "names create_issue, which an operation of this file names a write",
        ),
        ("{path: /mcp, tools: from_server, read_only_tools: {a: 1}}", "expected a list of strings"),
    ],
)
def test_the_from_server_keys_are_checked(mcp, problem):
    with pytest.raises(RulesError, match=re.escape(problem)):
        load_rules(RULES.replace("operations:", f"mcp: {mcp}\noperations:"), "mcp.yaml")
