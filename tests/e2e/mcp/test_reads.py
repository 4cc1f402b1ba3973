"""
Reconcile reads through an MCP server's read-only tool speak the revision the write was sent in
(issue 25, item 4). Real parts: the official SDK's server made to speak one revision only
(tests/e2e/mcp/server.py --speaks, JSON and SSE response modes, with find_issues, whose `title`
argument a 2026-07-28 call mirrors in `Mcp-Param-Title`), the SDK's own client, and a mitmdump
with the receipts addon.

- A write to a server that speaks only 2026-07-28, its answer lost: the retry's read is a
  2026-07-28 read (no initialize, no session, the request metadata headers, `_meta`), finds the
  issue, and the retry is told it already succeeded. Absent (the first call never ran): the read
  proves it, the receipt is safe_to_retry and the retry goes out. Before: the read began with
  `initialize`, the server answered 400 (-32022), the read failed and the receipt stayed
  `outcome_unknown` (then manual_review), the retry blocked.
- The same on a server that speaks only 2025-11-25: the read has a session of its own
  (initialize, one per read), and never sends the server a 2026-07-28 request.
- The revision is read from the call (its MCP-Protocol-Version header, else its `_meta`), noted
  with the intent and never fingerprinted (tests/reconcile/test_tool_reads.py).
- read_tool itself, against those servers and a receipt of each kind: which requests a read
  sends when the write's revision is 2026-07-28, 2025-11-25 or not recorded (server/discover
  first), and where it falls to the other revision (only where the endpoint's answer says it
  speaks it).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from proxy_addon.reconcile.tool_reads import read_tool
from proxy_addon.store import Receipt, Store
from tests.e2e.mcp.client import run_client
from tests.e2e.mcp.fixtures import McpServer
from tests.e2e.mcp.test_mcp import call, states, text
from tests.e2e.processes import Proxy
from tests.reconcile.test_tool_reads import LEGACY, MODERN

RULES = """\
api: tracker
hosts: ["127.0.0.1"]
operations:
  issues.create:
    match: {method: POST, path: /mcp, mcp: {tool: create_issue}}
    fingerprint: {body: [params.arguments.title, params.arguments.body]}
    external_id: number
    reconcile:
      read: {tool: find_issues, arguments: {title: "{intent.params.arguments.title}"}}
      items: issues
      find: {title: "{intent.params.arguments.title}", body: "{intent.params.arguments.body}"}
      # find_issues answers every issue with the title, in one answer: no pages
      complete_in_one_page: true
      absence_provable: true
      retry_when_absent: true
      external_id: number
"""


SERVERS = [(MODERN, "json"), (MODERN, "sse"), (LEGACY, "json"), (LEGACY, "sse")]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("mcp-reads")
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "tracker.yaml").write_text(RULES)
    p = Proxy(workdir, confdir, rules=rules).start()
    yield p
    p.stop()


@pytest.fixture(scope="module", params=SERVERS, ids=[f"{s}-only-{m}" for s, m in SERVERS])
def server(request, tmp_path_factory) -> Iterator[McpServer]:
    speaks, mode = request.param
    with McpServer(mode, tmp_path_factory.mktemp(f"mcp-{speaks}"), speaks=speaks, extra_tools=True) as s:
        yield s


def issue() -> dict[str, str]:
    return {"title": f"Drucker brennt ü {uuid.uuid4().hex[:8]}", "body": "Third floor"}  # ü: Mcp-Param-Title in base64


def mine(proxy: Proxy, title: str) -> list[Receipt]:
    store = Store.open(proxy.db, create=False)
    try:
        found = [
            r for r in store.list(limit=None) if (r.intent.get("body") or {}).get("params.arguments.title") == title
        ]
        return sorted(found, key=lambda r: r.submitted_at)
    finally:
        store.close()


def methods(requests: list[dict]) -> list[str | None]:
    return [r["jsonrpc_method"] or r["http_method"] for r in requests]


def check_the_reads_revision(server: McpServer) -> None:
    """Every request the server saw was in its own revision (none refused), the read's too: its find_issues call."""
    seen = server.effects()["requests"]
    assert [r for r in seen if r.get("fault") == "other_revision"] == [], "a request in a revision it does not speak"
    [find] = [r for r in seen if r.get("tool") == "find_issues"]
    headers = find["headers"]
    if server.speaks == MODERN:
        assert "initialize" not in methods(seen), "nobody, the read included, sent initialize"
        assert headers["mcp-protocol-version"] == MODERN and headers["mcp-method"] == "tools/call"
        assert headers["mcp-name"] == "find_issues" and headers["mcp-param-title"].startswith("=?base64?")
        assert "mcp-session-id" not in headers
        meta = json.loads(find["body"])["params"]["_meta"]
        assert meta["io.modelcontextprotocol/protocolVersion"] == MODERN
        assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "receipt-proxy-reconcile"
    else:
        assert methods(seen).count("initialize") == 2, "the client's session, and the read's own"
        assert "server/discover" not in methods(seen)
        agent = next(r for r in seen if r.get("tool") == "create_issue")["headers"]["mcp-session-id"]
        read = headers["mcp-session-id"]
        assert headers["mcp-protocol-version"] == LEGACY and read and read != agent, "a session of its own"
        assert [r for r in seen if r["http_method"] == "DELETE" and r["headers"].get("mcp-session-id") == read]


def revision_of(server: McpServer) -> str:
    return "legacy" if server.speaks == LEGACY else MODERN


def test_a_lost_answer_is_settled_by_a_read_in_the_servers_revision(server, proxy):
    server.reset()
    args = issue()
    server.queue("commit_then_drop")
    report = call(server, proxy, revision_of(server), ("call", "create_issue", args), ("call", "create_issue", args))
    lost, retry = report["results"]
    assert lost["is_error"] and "answer was lost" in text(lost)
    assert retry["is_error"] and "already succeeded" in text(retry), retry
    assert server.effects()["created"] == 1 and len(server.calls("create_issue")) == 1
    [receipt] = mine(proxy, args["title"])
    assert receipt.state == "succeeded" and receipt.external_id is not None and receipt.external_id.isdigit()
    assert receipt.intent["mcp_revision"] == server.speaks
    assert states(proxy, receipt.operation_id)[-3:] == ["outcome_unknown", "reconciling", "succeeded"]
    check_the_reads_revision(server)


def test_an_absent_effect_is_proven_by_a_read_in_the_servers_revision_and_the_retry_goes_out(server, proxy):
    server.reset()
    args = issue()
    # The first call never runs the tool, and its outcome is unknown: an internal error, made by the server's wrapper.
    server.can({"error": {"code": -32603, "message": "internal error (canned): the tool did not run"}})
    report = call(server, proxy, revision_of(server), ("call", "create_issue", args), ("call", "create_issue", args))
    failed, retry = report["results"]
    assert not failed["ok"] and failed["error"]["code"] == -32603
    assert retry["ok"] and not retry["is_error"] and retry["structured"]["title"] == args["title"], retry
    assert server.effects()["created"] == 1, "the retry's issue, and only it"
    first, second = mine(proxy, args["title"])
    assert states(proxy, first.operation_id)[-3:] == ["outcome_unknown", "reconciling", "safe_to_retry"]
    assert second.state == "succeeded" and second.retry_of == first.operation_id
    assert first.intent["mcp_revision"] == second.intent["mcp_revision"] == server.speaks
    check_the_reads_revision(server)
    seen = server.effects()["requests"]
    [canned, retried] = [i for i, r in enumerate(seen) if r.get("tool") == "create_issue"]
    [read] = [i for i, r in enumerate(seen) if r.get("tool") == "find_issues"]
    assert canned < read < retried, "the retry went out once the read had proven the first call absent"


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory) -> Iterator[dict[str, McpServer]]:
    """A server of each kind, JSON mode: speaking only 2026-07-28, only 2025-11-25, and both (the SDK's default)."""
    started = {}
    try:
        for name, speaks in (("modern", MODERN), ("legacy", LEGACY), ("both", None)):
            started[name] = McpServer(
                "json", tmp_path_factory.mktemp(f"read-{name}"), speaks=speaks, extra_tools=True
            ).start()
        yield started
    finally:
        for s in started.values():
            s.stop()


# (server, the write's revision, read_only: true in the rule) → the requests of one read
READS = [
    ("modern", MODERN, False, ["tools/list", "tools/call"]),
    # read_only: true, so no tools/list first: the call without Mcp-Param-Title is refused (-32020, before the
    # tool ran), and made again with the header its inputSchema asks for
    ("modern", MODERN, True, ["tools/call", "tools/list", "tools/call"]),
    ("modern", None, False, ["server/discover", "tools/list", "tools/call"]),
    ("modern", LEGACY, False, ["initialize", "tools/list", "tools/call"]),  # 400 -32022 naming 2026-07-28
    ("legacy", LEGACY, False, ["initialize", "notifications/initialized", "tools/list", "tools/call", "DELETE"]),
    (
        "legacy",
        None,
        False,
        ["server/discover", "initialize", "notifications/initialized", "tools/list", "tools/call", "DELETE"],
    ),
    (
        "legacy",
        MODERN,
        False,
        ["tools/list", "initialize", "notifications/initialized", "tools/list", "tools/call", "DELETE"],
    ),  # 400 without a modern error: the endpoint may speak legacy, and does
    ("both", None, False, ["server/discover", "tools/list", "tools/call"]),
    ("both", LEGACY, False, ["initialize", "notifications/initialized", "tools/list", "tools/call", "DELETE"]),
]


@pytest.mark.parametrize(
    "kind, revision, declared, sent",
    READS,
    ids=[f"{k}-server-{r or 'unrecorded'}{'-read_only' if d else ''}" for k, r, d, _ in READS],
)
def test_a_read_speaks_the_writes_revision_and_falls_back_only_where_the_endpoint_speaks_another(
    endpoints, kind, revision, declared, sent
):
    server = endpoints[kind]
    server.reset()
    title = f"Drucker brennt ü {uuid.uuid4().hex[:8]}"
    # an issue to find, made straight on the server (no proxy) in its own revision
    made = run_client(
        server.url,
        [("call", "create_issue", {"title": title, "body": "b"})],
        revision="legacy" if kind == "legacy" else MODERN,
    )
    assert made["results"][0]["ok"], made
    before = len(server.effects()["requests"])

    async def read() -> tuple[int, dict, bytes]:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            return await read_tool(
                client, server.url, "find_issues", {"title": title}, {}, declared_read_only=declared, revision=revision
            )

    status, _, body = asyncio.run(read())
    assert status == 200 and [i["title"] for i in json.loads(body)["issues"]] == [title]
    seen = server.effects()["requests"][before:]
    assert methods(seen) == sent
    assert server.effects()["created"] == 1
    calls = [r for r in seen if r["jsonrpc_method"] == "tools/call"]
    last = calls[-1]["headers"]
    if "initialize" in sent and kind != "modern":
        assert last["mcp-protocol-version"] == LEGACY and last.get("mcp-session-id")
    else:
        assert last["mcp-protocol-version"] == MODERN and "mcp-session-id" not in last
        assert last["mcp-name"] == "find_issues" and last["mcp-param-title"].startswith("=?base64?")
