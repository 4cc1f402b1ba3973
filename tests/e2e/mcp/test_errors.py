"""
JSON-RPC errors a server raises before it runs the tool are `rejected`, with the specification's
words in the reason, and the retry goes out as a new attempt; -32603, -32600 under the call's id
and other codes are `outcome_unknown`, and the retry is blocked (issue 25, item 5). Real parts:
a mitmdump with the receipts addon, and
- the hand-made endpoint of tests/e2e/mcp/error_upstream.py, for every code in every framing: JSON
  and an event stream under 200, and JSON under the HTTP status the specification gives it
  (400; 404 for -32601), with `"id": null` where JSON-RPC puts it (a parse error, an invalid
  request), and a raw client (httpx);
- the official SDK's server (tests/e2e/mcp/server.py, JSON and SSE response modes) where it raises
  the code itself: -32602 and -32603 (its faults), -32021 (a tool whose resolver asks the user,
  called by a client that declares no elicitation), -32600 under the call's id (a tool that
  writes, then asks the user from its body: the SDK raises it after the effect), and, for a
  raw client's request, -32020 (no Mcp-Method header), -32022 (a revision it does not speak)
  and -32600 without an id (a `jsonrpc` that is not "2.0").
Each case counts the tool's effects and the requests that reached the server, and checks the
receipt's state and reason and what the client got. A request the proxy itself refuses with a
JSON-RPC error (-32600, outcome/tool_answers.py) makes no receipt and reaches no server: it is never
taken for the upstream's answer. The classification alone: tests/outcome/test_tool_outcomes.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from proxy_addon.store import Receipt, Store
from tests.e2e.mcp.error_upstream import ErrorUpstream
from tests.e2e.mcp.fixtures import MODES, McpServer
from tests.e2e.mcp.test_mcp import call, text
from tests.e2e.processes import Proxy

RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
  issues.create_confirmed:
    match: {method: POST, path: /mcp, mcp: {tool: create_confirmed_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
  issues.create_then_confirm:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue_then_confirm}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
"""


ACCEPT = "application/json, text/event-stream"


MODERN, LEGACY = "2026-07-28", "2025-11-25"


REFUSED = "the server refused the call before running the tool"


MAY_HAVE_RUN = "the tool may have run before it failed"


# What the receipt's reason quotes of the specification (schema 2026-07-28), code by code.
WORDS = {
    -32700: "Parse error: invalid JSON was received by the server",
    -32600: "Invalid Request: the request is not a valid request object",
    -32601: "Method not found: the requested method does not exist or is not available",
    -32602: "Invalid params: the method parameters are invalid or malformed",
    -32020: "HeaderMismatch: the HTTP headers of the request do not match the corresponding values in its body",
    -32021: "MissingRequiredClientCapability: the server requires a client capability that was not declared",
    -32022: "UnsupportedProtocolVersion: the request's protocol version is not supported by the server",
    -32603: "Internal error: an internal error occurred on the receiver",
}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("mcp-errors")
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(workdir, confdir, rules=rules).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def upstream() -> Iterator[ErrorUpstream]:
    with ErrorUpstream() as up:
        yield up


def mine(proxy: Proxy, title: str) -> list[Receipt]:
    store = Store.open(proxy.db, create=False)
    try:
        found = [
            r for r in store.list(limit=None) if (r.intent.get("body") or {}).get("params.arguments.title") == title
        ]
        return sorted(found, key=lambda r: r.submitted_at)
    finally:
        store.close()


def reasons(proxy: Proxy, receipt: Receipt) -> list[str]:
    store = Store.open(proxy.db, create=False)
    try:
        return [e.reason or "" for e in store.events(receipt.operation_id) if e.event == "transition"]
    finally:
        store.close()


def tool_call(rid: object, args: dict, *, revision: str, tool: str = "create_issue", **envelope: object) -> tuple:
    """A tools/call as a client of `revision` sends it: (body, headers)."""
    params: dict = {"name": tool, "arguments": args}
    headers = {"Accept": ACCEPT, "Content-Type": "application/json", "MCP-Protocol-Version": revision}
    if revision == MODERN:
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        headers.update({"Mcp-Method": "tools/call", "Mcp-Name": tool})
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params, **envelope}
    return body, headers


def post(proxy: Proxy, url: str, body: dict, headers: dict) -> tuple[int, dict]:
    """Send one POST through the proxy; its status and the JSON-RPC message it answered (JSON or the last event)."""
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=30) as client:
        r = client.post(url, content=json.dumps(body).encode(), headers=headers)
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        return r.status_code, json.loads(data[-1])
    return r.status_code, r.json()


def check_refused(proxy: Proxy, title: str, code: int, *, retried: bool = True) -> Receipt:
    """The first receipt of `title` is rejected, in the specification's words; with `retried`, the retry succeeded."""
    receipts = mine(proxy, title)
    first = receipts[0]
    assert first.state == "rejected", (first.state, first.error)
    assert WORDS[code] in (first.error or "") and REFUSED in (first.error or ""), first.error
    assert any(WORDS[code] in r and REFUSED in r for r in reasons(proxy, first))
    if retried:
        assert [r.state for r in receipts[1:]] == ["succeeded"] and receipts[1].retry_of == first.operation_id
    return first


def check_unknown(proxy: Proxy, title: str, words: str) -> Receipt:
    """The only receipt of `title` is outcome_unknown, and says the tool may have run."""
    [receipt] = mine(proxy, title)
    assert receipt.state == "outcome_unknown", (receipt.state, receipt.error)
    assert words in (receipt.error or "") and MAY_HAVE_RUN in (receipt.error or ""), receipt.error
    return receipt


@dataclass(frozen=True)
class Cell:
    code: int
    framing: str  # json or sse
    status: int
    with_id: bool = True
    state: str = "rejected"

    @property
    def name(self) -> str:
        return f"{self.code}-{self.framing}-{self.status}" + ("" if self.with_id else "-id-null")


CELLS = [
    *(
        c
        for code in (-32700, -32600)
        for c in (Cell(code, "json", 200, with_id=False), Cell(code, "json", 400, with_id=False))
    ),
    Cell(-32700, "sse", 200),
    Cell(-32601, "json", 200),
    Cell(-32601, "json", 404),
    Cell(-32601, "sse", 200),
    *(
        c
        for code in (-32602, -32020, -32021, -32022)
        for c in (Cell(code, "json", 200), Cell(code, "json", 400), Cell(code, "sse", 200))
    ),
    # -32600 under the call's id: the server had read the call (the SDK raises it from a running tool)
    Cell(-32600, "json", 200, state="outcome_unknown"),
    Cell(-32600, "json", 400, state="outcome_unknown"),
    Cell(-32600, "sse", 200, state="outcome_unknown"),
    *(
        Cell(-32603, f, s, state="outcome_unknown")
        for f, s in (("json", 200), ("json", 400), ("json", 500), ("sse", 200))
    ),
    Cell(-32000, "json", 200, state="outcome_unknown"),
    Cell(-32000, "sse", 200, state="outcome_unknown"),
]


@pytest.mark.parametrize("cell", CELLS, ids=[c.name for c in CELLS])
def test_every_error_code_in_every_framing(cell: Cell, upstream, proxy):
    args = {"title": f"Printer on fire {uuid.uuid4().hex[:8]}", "body": "Third floor"}
    revision = MODERN if cell.code in (-32020, -32021, -32022) else LEGACY
    ran_first = cell.state == "outcome_unknown"  # where the tool may have run, it did: the retry must not run it again
    upstream.answer(cell.code, framing=cell.framing, status=cell.status, with_id=cell.with_id, commit=ran_first)
    status, got = post(proxy, upstream.url, *tool_call(1, args, revision=revision))
    assert (status, got["error"]["code"]) == (cell.status, cell.code), "the client gets the server's own answer"
    assert got["id"] == (1 if cell.with_id else None)
    assert upstream.requests(args["title"]) == 1 and upstream.effects(args["title"]) == int(ran_first)

    status, again = post(proxy, upstream.url, *tool_call(2, args, revision=revision))
    if cell.state == "rejected":
        check_refused(proxy, args["title"], cell.code)
        assert status == 200 and again["id"] == 2 and again["result"]["structuredContent"]["title"] == args["title"]
        assert upstream.requests(args["title"]) == 2, "the retry went out: a new attempt"
        assert upstream.effects(args["title"]) == 1, "nothing ran but the retry"
    else:
        check_unknown(proxy, args["title"], WORDS.get(cell.code, f"JSON-RPC error {cell.code}"))
        assert status == 200 and again["result"]["isError"] and "NOT SENT" in again["result"]["content"][0]["text"]
        assert upstream.requests(args["title"]) == 1 and upstream.effects(args["title"]) == 1, "blocked"


def test_a_json_rpc_error_the_proxy_makes_is_never_taken_for_the_upstreams(upstream, proxy):
    """The proxy refuses a call whose Mcp-Name disagrees with its body with its own -32600: no receipt, nothing sent."""
    args = {"title": f"Printer on fire {uuid.uuid4().hex[:8]}", "body": "Third floor"}
    body, headers = tool_call(1, args, revision=MODERN)
    status, got = post(proxy, upstream.url, body, {**headers, "Mcp-Name": "list_issues"})
    assert (status, got["id"], got["error"]["code"]) == (400, 1, -32600) and "Mcp-Name" in got["error"]["message"]
    assert upstream.requests(args["title"]) == 0 and mine(proxy, args["title"]) == []
    status, ok = post(proxy, upstream.url, *tool_call(2, args, revision=MODERN))
    assert status == 200 and ok["result"]["structuredContent"]["title"] == args["title"]
    [receipt] = mine(proxy, args["title"])
    assert receipt.state == "succeeded" and receipt.retry_of is None, "a first write: no refusal before it"
    assert upstream.requests(args["title"]) == upstream.effects(args["title"]) == 1


@pytest.fixture(scope="module", params=MODES)
def server(request, tmp_path_factory) -> Iterator[McpServer]:
    with McpServer(request.param, tmp_path_factory.mktemp(f"mcp-errors-{request.param}"), extra_tools=True) as s:
        yield s


def issue() -> dict[str, str]:
    return {"title": f"Printer on fire {uuid.uuid4().hex[:8]}", "body": "Third floor"}


@pytest.mark.parametrize("revision", ["legacy", MODERN])
def test_invalid_params_from_the_sdk_is_rejected_in_its_words_and_the_retry_goes_out(server, proxy, revision):
    server.reset()
    args = issue()
    server.queue("invalid_params")
    refused, retry = call(server, proxy, revision, ("call", "create_issue", args), ("call", "create_issue", args))[
        "results"
    ]
    assert not refused["ok"] and refused["error"]["code"] == -32602
    assert retry["ok"] and not retry["is_error"] and retry["structured"]["title"] == args["title"]
    check_refused(proxy, args["title"], -32602)
    assert len(server.calls("create_issue")) == 2 and server.effects()["created"] == 1


@pytest.mark.parametrize("revision", ["legacy", MODERN])
def test_an_internal_error_from_the_sdk_stays_unknown_and_the_retry_is_blocked(server, proxy, revision):
    server.reset()
    args = issue()
    server.queue("internal_error")  # the issue is recorded, then -32603
    failed, retry = call(server, proxy, revision, ("call", "create_issue", args), ("call", "create_issue", args))[
        "results"
    ]
    assert not failed["ok"] and failed["error"]["code"] == -32603
    assert retry["is_error"] and text(retry).startswith("NOT SENT")
    check_unknown(proxy, args["title"], WORDS[-32603])
    assert len(server.calls("create_issue")) == 1 and server.effects()["created"] == 1


@pytest.mark.parametrize("revision", [MODERN, "legacy"])
def test_a_missing_client_capability_is_rejected_and_each_retry_goes_out(server, proxy, revision):
    """
    The tool's resolver asks the user to confirm, before its body runs; the SDK's client declares
    no elicitation: -32021. (A legacy JSON-mode session has no channel for the question at all:
    the SDK answers -32600 under the call's id, which proves nothing: outcome_unknown, the retry
    blocked, though here nothing ran.)
    """
    server.reset()
    args = issue()
    first, retry = call(
        server, proxy, revision, ("call", "create_confirmed_issue", args), ("call", "create_confirmed_issue", args)
    )["results"]
    if revision == "legacy" and server.mode == "json":
        assert not first["ok"] and first["error"]["code"] == -32600
        assert retry["is_error"] and text(retry).startswith("NOT SENT")
        check_unknown(proxy, args["title"], "under the call's id")
        assert len(server.calls("create_confirmed_issue")) == 1 and server.effects()["created"] == 0
        return
    assert not first["ok"] and first["error"]["code"] == -32021
    assert not retry["ok"] and retry["error"]["code"] == -32021, "sent again, and refused again"
    receipts = mine(proxy, args["title"])
    assert [r.state for r in receipts] == ["rejected", "rejected"] and receipts[1].retry_of == receipts[0].operation_id
    check_refused(proxy, args["title"], -32021, retried=False)
    assert len(server.calls("create_confirmed_issue")) == 2 and server.effects()["created"] == 0


@pytest.mark.parametrize("revision", [MODERN, "legacy"])
def test_invalid_request_raised_by_a_running_tool_after_its_effect_is_unknown(server, proxy, revision):
    """
    create_issue_then_confirm records the issue, then asks the user from its body; the SDK cannot
    send the question (no back-channel) and answers -32600 under the call's id: 400 in 2026-07-28,
    200 in a legacy JSON-mode session. (A legacy SSE session carries the question; the SDK's
    client, without an elicitation callback, refuses it with -32600, which the tool raises as
    its own.) Before: the 400 was `rejected`, the retry went out and made a second issue.
    """
    server.reset()
    args = issue()
    failed, retry = call(
        server,
        proxy,
        revision,
        ("call", "create_issue_then_confirm", args),
        ("call", "create_issue_then_confirm", args),
    )["results"]
    assert not failed["ok"] and failed["error"]["code"] == -32600
    assert retry["is_error"] and text(retry).startswith("NOT SENT")
    check_unknown(proxy, args["title"], "under the call's id")
    assert len(server.calls("create_issue_then_confirm")) == 1 and server.effects()["created"] == 1


SDK_RAW = [
    # (name, the code, how the first request differs from a well-formed 2026-07-28 tools/call)
    ("no-mcp-method-header", -32020, {"drop": "Mcp-Method"}),
    ("a-revision-it-does-not-speak", -32022, {"version": "2099-01-01"}),
    ("jsonrpc-1.0", -32600, {"envelope": {"jsonrpc": "1.0"}}),  # answered with "id": null
]


@pytest.mark.parametrize("name, code, change", SDK_RAW, ids=[n for n, _, _ in SDK_RAW])
def test_the_sdk_refuses_a_malformed_request_before_the_tool_and_the_retry_goes_out(server, proxy, name, code, change):
    server.reset()
    args = issue()
    body, headers = tool_call(1, args, revision=MODERN)
    if "drop" in change:
        del headers[change["drop"]]
    if "version" in change:
        headers["MCP-Protocol-Version"] = change["version"]
        body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = change["version"]
    body.update(change.get("envelope", {}))
    status, got = post(proxy, server.url, body, headers)
    assert status == 400 and got["error"]["code"] == code, got
    assert server.effects()["created"] == 0 and len(server.calls("create_issue")) == 1
    status, ok = post(proxy, server.url, *tool_call(2, args, revision=MODERN))
    assert status == 200 and ok["result"]["structuredContent"]["title"] == args["title"], ok
    check_refused(proxy, args["title"], code)
    assert server.effects()["created"] == 1 and len(server.calls("create_issue")) == 2
