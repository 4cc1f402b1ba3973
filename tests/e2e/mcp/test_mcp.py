"""
Receipts for MCP tool calls, with real parts: the official SDK's MCP server (tests/e2e/mcp/server.py,
JSON and SSE response modes) and its own client in a subprocess (tests/e2e/mcp/client.py), in both
protocol revisions (legacy 2025-11-25 and the default 2026-07-28), through a real mitmdump with
the receipts addon, found by the client through HTTP_PROXY. Faults come from the server.

The fault matrix for tool calls: a retry after a dropped answer is blocked and the client's result
holds the model-visible text; a retry after a success gets the replay under its own JSON-RPC id;
tools/list and initialize/discover pass untouched; a tool error is rejected and may be retried; an
internal error after the effect blocks the retry; a call whose answer outlives the client's timeout
is recorded when it comes, and the retry is replayed; a reconcile read through a read-only tool
settles a lost answer; `mcp.tools: from_server` takes every tool as a write but those the rules
name reads (`mcp.read_only_tools`), and, only when the rules trust the server's annotations
(`mcp.annotations: trusted`), those its tools/list declares readOnlyHint: true: a server that lies
about a writing tool (log_issue) gets its calls recorded unless trusted (issue 24, item 13). What
from_server stores of an argument is bounded: a large one is a keyed hash, its fingerprint whole.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from proxy_addon.store import Receipt, Store
from tests.conftest import recorded_answer, wait_for
from tests.e2e.mcp.client import REVISIONS, run_client
from tests.e2e.processes import Proxy

RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    description: Create an issue through the MCP server's create_issue tool
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
"""

RECONCILED_RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
    reconcile:
      read: {tool: list_issues}
      items: issues
      find: {title: "{intent.params.arguments.title}", body: "{intent.params.arguments.body}"}
      absence_provable: false
      external_id: number
"""

FROM_SERVER_RULES = """\
api: tracker
hosts: ["127.0.0.1"]
mcp: {path: /mcp, tools: from_server, read_only_tools: [list_issues]}
operations:
"""

TRUSTING_RULES = """\
api: tracker
hosts: ["127.0.0.1"]
mcp: {path: /mcp, tools: from_server, annotations: trusted}
operations:
"""


def _proxy(tmp_path_factory, confdir, name: str, text: str) -> Proxy:
    workdir = tmp_path_factory.mktemp(f"mcp-{name}")
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(text)
    return Proxy(workdir, confdir, rules=rules).start()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir):
    p = _proxy(tmp_path_factory, confdir, "declared", RULES)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def reconciling_proxy(tmp_path_factory, confdir):
    p = _proxy(tmp_path_factory, confdir, "reconciled", RECONCILED_RULES)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def from_server_proxy(tmp_path_factory, confdir):
    p = _proxy(tmp_path_factory, confdir, "from-server", FROM_SERVER_RULES)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def trusting_proxy(tmp_path_factory, confdir):
    p = _proxy(tmp_path_factory, confdir, "trusting", TRUSTING_RULES)
    yield p
    p.stop()


def issue() -> dict[str, str]:
    return {"title": f"Printer on fire {uuid.uuid4().hex[:8]}", "body": "Third floor"}


def receipts(proxy: Proxy, title: str | None = None) -> list[Receipt]:
    if not Path(proxy.db).exists():
        return []
    store = Store.open(proxy.db, create=False)
    try:
        found = [r for r in store.list(limit=None) if title is None or title in json.dumps(r.intent)]
        return sorted(found, key=lambda r: r.submitted_at)
    finally:
        store.close()


def events(proxy: Proxy, operation_id: str) -> list[str]:
    store = Store.open(proxy.db, create=False)
    try:
        return [e.event for e in store.events(operation_id)]
    finally:
        store.close()


def states(proxy: Proxy, operation_id: str) -> list[str]:
    store = Store.open(proxy.db, create=False)
    try:
        return [str(e.to_state) for e in store.events(operation_id) if e.event == "transition"]
    finally:
        store.close()


def call(server, proxy: Proxy, revision: str, *ops: tuple, timeout: float = 5.0) -> dict:
    report = run_client(server.url, list(ops), revision=revision, proxy=proxy.url, ca=proxy.ca, timeout=timeout)
    assert "connect_error" not in report, report
    # The 2026 client falls back to the legacy revision if server/discover fails: it must not have.
    assert report["protocol_version"] == ("2025-11-25" if revision == "legacy" else "2026-07-28"), report
    return report


def text(result: dict) -> str:
    return "".join(c.get("text", "") for c in result.get("content") or [])


def calls_http(report: dict, tool_calls_only: bool = True) -> list[dict]:
    return [h for h in report["http"] if not tool_calls_only or h["jsonrpc_method"] == "tools/call"]


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_retry_after_a_dropped_answer_is_blocked_with_words_for_the_model(mcp_server, proxy, revision):
    args = issue()
    mcp_server.queue("commit_then_drop")
    report = call(mcp_server, proxy, revision, ("call", "create_issue", args), ("call", "create_issue", args))
    first, retry = report["results"]
    assert mcp_server.effects()["created"] == 1, "the retry must not make a second issue"
    assert len(mcp_server.calls("create_issue")) == 1
    [receipt] = receipts(proxy, args["title"])
    assert receipt.state == "outcome_unknown" and receipt.api == "tracker" and receipt.operation == "issues.create"
    # Both answers reach the model as tool results (HTTP 200, isError), never as a bare HTTP error.
    assert first["ok"] and first["is_error"], first
    assert "answer was lost" in text(first) and receipt.operation_id in text(first)
    assert retry["ok"] and retry["is_error"], retry
    said = text(retry)
    assert said.startswith("NOT SENT") and receipt.operation_id in said and "outcome is unknown" in said
    assert [h["status"] for h in calls_http(report)] == [200, 200]
    if revision == "2026-07-28":
        assert retry["result"].get("result_type", retry["result"].get("resultType")) == "complete"
    assert "blocked" in events(proxy, receipt.operation_id)


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_retry_after_a_success_is_the_recorded_result_under_its_own_id(mcp_server, proxy, revision):
    args = issue()
    report = call(mcp_server, proxy, revision, ("call", "create_issue", args), ("call", "create_issue", args))
    first, retry = report["results"]
    assert first["ok"] and not first["is_error"] and first["structured"]["title"] == args["title"]
    assert retry["ok"] and not retry["is_error"], retry  # the client matched the replay to its request's id
    assert retry["structured"] == first["structured"]
    assert mcp_server.effects()["created"] == 1
    [receipt] = receipts(proxy, args["title"])
    assert receipt.state == "succeeded" and receipt.external_id == str(first["structured"]["number"])
    assert "replayed" in events(proxy, receipt.operation_id)
    ids = [h["id"] for h in calls_http(report)]
    assert len(set(ids)) == 2, ids  # two requests, two ids: the replay carried the second
    # The session of the first call is never replayed into another one.
    assert not any(k.lower() == "mcp-session-id" for k, _ in recorded_answer(proxy.db, receipt).headers)


@pytest.mark.parametrize("revision", REVISIONS)
def test_other_messages_pass_untouched(mcp_server, proxy, revision):
    before = len(receipts(proxy))
    report = call(mcp_server, proxy, revision, ("list_tools",), ("call", "list_issues", {}), ("list_tools",))
    listed, issues, again = report["results"]
    assert listed["ok"] and again["ok"] and issues["ok"] and not issues["is_error"]
    assert {t["name"] for t in listed["tools"]} >= {"create_issue", "list_issues", "get_issue"}
    assert len(receipts(proxy)) == before, "initialize, discover, tools/list and unmatched tools make no receipt"
    seen = [r["jsonrpc_method"] for r in mcp_server.effects()["requests"]]
    assert seen.count("tools/list") >= 2 and ("initialize" in seen or "server/discover" in seen)


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_tool_error_is_rejected_and_the_retry_is_sent(mcp_server, proxy, revision):
    args = issue()
    mcp_server.queue("tool_error")
    report = call(mcp_server, proxy, revision, ("call", "create_issue", args), ("call", "create_issue", args))
    refused, retry = report["results"]
    assert refused["ok"] and refused["is_error"]  # the server's own tool error, passed on
    assert retry["ok"] and not retry["is_error"]
    assert len(mcp_server.calls("create_issue")) == 2 and mcp_server.effects()["created"] == 1
    states = [r.state for r in receipts(proxy, args["title"])]
    assert states == ["rejected", "succeeded"]


@pytest.mark.parametrize("fault, state", [("internal_error", "outcome_unknown"), ("invalid_params", "rejected")])
def test_jsonrpc_errors_are_classified_by_code(mcp_json_server, proxy, fault, state):
    server = mcp_json_server
    server.reset()
    args = issue()
    server.queue(fault)
    report = call(server, proxy, "legacy", ("call", "create_issue", args), ("call", "create_issue", args))
    first, retry = report["results"]
    assert not first["ok"] and first["error"]["code"] in (-32603, -32602)
    [first_receipt, *rest] = receipts(proxy, args["title"])
    assert first_receipt.state == state
    if state == "outcome_unknown":  # the tool may have run: the retry is blocked
        assert retry["is_error"] and "NOT SENT" in text(retry) and not rest
        assert len(server.calls("create_issue")) == 1
    else:  # refused before running: the retry is sent
        assert not retry["is_error"] and [r.state for r in rest] == ["succeeded"]
        assert len(server.calls("create_issue")) == 2


def test_an_answer_that_outlives_the_client_is_recorded_and_replayed(mcp_sse_server, proxy):
    server = mcp_sse_server
    server.reset()
    args = issue()
    server.queue("commit_then_hang")  # the answer comes after 3 s; the client waits 1 s
    first = call(server, proxy, "2026-07-28", ("call", "create_issue", args), timeout=1.0)["results"][0]
    assert not first["ok"]
    wait_for(
        lambda: [r for r in receipts(proxy, args["title"]) if r.state == "succeeded"],
        timeout=15,
        what="the proxy to record the late answer",
    )
    retry = call(server, proxy, "2026-07-28", ("call", "create_issue", args))["results"][0]
    assert retry["ok"] and not retry["is_error"] and retry["structured"]["title"] == args["title"]
    assert server.effects()["created"] == 1


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_lost_answer_is_settled_by_a_read_only_tool(mcp_server, reconciling_proxy, revision):
    args = issue()
    mcp_server.queue("commit_then_drop")
    report = call(
        mcp_server, reconciling_proxy, revision, ("call", "create_issue", args), ("call", "create_issue", args)
    )
    first, retry = report["results"]
    assert first["is_error"] and "answer was lost" in text(first)
    assert mcp_server.effects()["created"] == 1
    [receipt] = receipts(reconciling_proxy, args["title"])
    assert receipt.state == "succeeded" and receipt.external_id is not None and receipt.external_id.isdigit()
    assert states(reconciling_proxy, receipt.operation_id)[-3:] == ["outcome_unknown", "reconciling", "succeeded"]
    # The read went in the write's revision (legacy: a session of its own, initialize first; 2026-07-28: none),
    # read tools/list (no read_only in the rule), and made a tools/call of list_issues; never a second
    # create_issue. (tests/e2e/mcp/test_reads.py: servers that speak one revision only.)
    assert [c["tool"] for c in mcp_server.calls()] == ["create_issue", "list_issues"]
    assert retry["is_error"] and "already succeeded" in text(retry)


@pytest.mark.parametrize("revision", REVISIONS)
def test_from_server_treats_tools_by_their_annotations_when_the_rules_trust_them(
    mcp_json_server, trusting_proxy, revision
):
    server = mcp_json_server
    server.reset()
    args = issue()
    report = call(
        server,
        trusting_proxy,
        revision,
        ("list_tools",),
        ("call", "list_issues", {}),
        ("call", "create_issue", args),
        ("call", "create_issue", args),
    )
    listed, read, created, replayed = report["results"]
    assert listed["ok"] and read["ok"] and created["ok"] and replayed["ok"]
    assert replayed["structured"] == created["structured"]
    assert server.effects()["created"] == 1
    found = receipts(trusting_proxy)
    mine = [r for r in found if r.intent.get("tool") == "create_issue" and args["title"] in json.dumps(r.intent)]
    assert [r.state for r in mine] == ["succeeded"] and mine[0].operation == "from_server"
    assert mine[0].intent["body"] == {f"params.arguments.{k}": v for k, v in sorted(args.items())}
    assert not [r for r in found if r.intent.get("tool") == "list_issues"], "a read-only tool is a read"
    said = "reads by the server's readOnlyHint: true (mcp.annotations: trusted"
    assert said in trusting_proxy.log() and "get_issue, list_issues, log_issue" in trusting_proxy.log()


@pytest.mark.parametrize("revision", REVISIONS)
def test_from_server_records_a_tool_a_lying_server_declares_read_only(mcp_json_server, from_server_proxy, revision):
    """
    Issue 24, item 13: log_issue writes, yet the server declares it readOnlyHint: true. The rules
    do not trust the server's annotations (the default): its call gets a receipt, and the retry
    after a lost answer is blocked. Before, the call passed untouched and the retry made a second issue.
    """
    server = mcp_json_server
    server.reset()
    args = issue()
    server.queue("commit_then_drop")
    report = call(
        server, from_server_proxy, revision, ("list_tools",), ("call", "log_issue", args), ("call", "log_issue", args)
    )
    listed, lost, retry = report["results"]
    assert listed["ok"] and {t["name"]: t["annotations"]["readOnlyHint"] for t in listed["tools"]}["log_issue"]
    assert server.effects()["created"] == 1, "the retry must not make a second issue"
    assert len(server.calls("log_issue")) == 1
    [receipt] = receipts(from_server_proxy, args["title"])
    assert (receipt.operation, receipt.intent["tool"], receipt.state) == ("from_server", "log_issue", "outcome_unknown")
    assert lost["is_error"] and "answer was lost" in text(lost)
    assert retry["is_error"] and text(retry).startswith("NOT SENT") and receipt.operation_id in text(retry)
    log = from_server_proxy.log()
    assert "the server says readOnlyHint: true of get_issue, log_issue, but its annotations are not trusted" in log
    assert "reads named in mcp.read_only_tools" in log and "list_issues" in log


@pytest.mark.parametrize("revision", REVISIONS)
def test_from_server_takes_as_reads_the_tools_the_rules_name(mcp_json_server, from_server_proxy, revision):
    """list_issues is named in mcp.read_only_tools: a read. get_issue is only declared read-only: a write.
    (No reset: each revision's run reads an issue of its own, so the second is not the first's replay.)"""
    server = mcp_json_server
    made = call(server, from_server_proxy, revision, ("call", "create_issue", issue()))["results"][0]
    number = made["structured"]["number"]
    before = {r.operation_id for r in receipts(from_server_proxy)}
    report = call(
        server, from_server_proxy, revision, ("call", "list_issues", {}), ("call", "get_issue", {"number": number})
    )
    listed, got = report["results"]
    assert listed["ok"] and got["ok"] and not got["is_error"], report
    new = [r for r in receipts(from_server_proxy) if r.operation_id not in before]
    assert [(r.intent["tool"], r.state) for r in new] == [("get_issue", "succeeded")]


def test_from_server_stores_a_large_argument_as_a_hash_and_fingerprints_it_whole(mcp_json_server, from_server_proxy):
    """Issue 24: from_server stored tool arguments of any size. A 256 KiB body is stored as a keyed hash (noted),
    yet the same body is one intent (replayed) and a body one character apart is another (sent)."""
    server = mcp_json_server
    server.reset()
    big = {"title": f"Large {uuid.uuid4().hex[:8]}", "body": "x" * (256 * 1024)}
    other = {**big, "body": big["body"][:-1] + "y"}
    report = call(
        server,
        from_server_proxy,
        "legacy",
        ("call", "create_issue", big),
        ("call", "create_issue", big),
        ("call", "create_issue", other),
        timeout=30,
    )
    first, again, second = report["results"]
    assert first["ok"] and again["ok"] and second["ok"]
    assert server.effects()["created"] == 2
    rs = receipts(from_server_proxy, big["title"])
    assert [r.state for r in rs] == ["succeeded", "succeeded"]
    for r in rs:
        stored = r.intent["body"]
        assert stored["params.arguments.title"] == big["title"]
        assert stored["params.arguments.body"].startswith("hmac:")
        assert r.intent["bounded"] == ["intent.params.arguments.body"]
        assert len(json.dumps(r.intent)) < 4096
    assert rs[0].intent_fingerprint != rs[1].intent_fingerprint
    assert rs[0].intent["body"]["params.arguments.body"] != rs[1].intent["body"]["params.arguments.body"]
    assert "replayed" in events(from_server_proxy, rs[0].operation_id)


def test_routing_headers_that_disagree_with_the_body_are_refused(mcp_json_server, proxy):
    server = mcp_json_server
    server.reset()
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "create_issue", "arguments": issue()}}
    headers = {
        "Mcp-Method": "tools/call",
        "Mcp-Name": "list_issues",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
    }
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as client:
        r = client.post(server.url, json=body, headers=headers)
    assert r.status_code == 400
    doc = r.json()
    assert doc["id"] == 9 and doc["error"]["code"] == -32600 and "Mcp-Name" in doc["error"]["message"]
    assert server.effects()["requests"] == [], "nothing was forwarded"


def test_a_batch_holding_a_tool_call_is_refused(mcp_json_server, proxy):
    server = mcp_json_server
    server.reset()
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_issue", "arguments": issue()}}
    ]
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as client:
        r = client.post(server.url, json=batch, headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 400 and "batch" in r.json()["error"]["message"]
    assert server.effects()["requests"] == []


def test_the_cli_reconciles_a_tool_call_through_its_read_tool(mcp_json_server, reconciling_proxy):
    """`receipts reconcile ID` runs the same read as the proxy: a session of its own, the read-only tool."""
    import os
    import subprocess
    import sys

    server = mcp_json_server
    server.reset()
    args = issue()
    server.queue("commit_then_drop")
    first = call(server, reconciling_proxy, "legacy", ("call", "create_issue", args))["results"][0]
    assert first["is_error"] and "answer was lost" in text(first)
    [receipt] = receipts(reconciling_proxy, args["title"])
    assert receipt.state == "outcome_unknown"
    receipts_cli = Path(sys.executable).parent / "receipts"
    done = subprocess.run(
        [
            str(receipts_cli),
            "--db",
            str(reconciling_proxy.db),
            "reconcile",
            receipt.operation_id,
            "--rules",
            str(reconciling_proxy.rules),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [settled] = receipts(reconciling_proxy, args["title"])
    assert settled.state == "succeeded" and settled.external_id is not None
    assert [c["tool"] for c in server.calls()] == ["create_issue", "list_issues"]
    assert server.effects()["created"] == 1


@pytest.mark.parametrize("revision", REVISIONS)
def test_an_https_mcp_server_gets_receipts_too(tmp_path_factory, confdir, revision):
    """Real MCP servers speak https: the addon's own exchange, TLS verified against the server's CA."""
    from tests.e2e.mcp.fixtures import McpServer

    with McpServer("json", tmp_path_factory.mktemp("mcp-tls"), tls=True) as server:
        workdir = tmp_path_factory.mktemp("mcp-tls-proxy")
        rules = workdir / "rules"
        rules.mkdir()
        (rules / "tracker.yaml").write_text(RULES)
        proxy = Proxy(workdir, confdir, rules=rules, upstream_ca=server.cert_path).start()
        try:
            args = issue()
            server.queue("commit_then_drop")
            report = call(
                server,
                proxy,
                revision,
                ("call", "create_issue", args),
                ("call", "create_issue", args),
                ("call", "create_issue", {**args, "body": "Fourth floor"}),
            )
            lost, blocked, other = report["results"]
            assert lost["is_error"] and "answer was lost" in text(lost)
            assert blocked["is_error"] and text(blocked).startswith("NOT SENT")
            assert other["ok"] and not other["is_error"]  # another intent: sent
            assert server.effects()["created"] == 2
            assert [r.state for r in receipts(proxy, args["title"])] == ["outcome_unknown", "succeeded"]
        finally:
            proxy.stop()
