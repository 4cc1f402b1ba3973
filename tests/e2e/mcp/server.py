"""
A real MCP server (the official SDK's `mcp.server.mcpserver.MCPServer`, mcp 2.x) on 127.0.0.1 over
Streamable HTTP, for the tests of MCP tool calls through the proxy. It serves both protocol
revisions at once: the legacy 2025-11-25 one (initialize, then Mcp-Session-Id) and 2026-07-28
(server/discover, no session, Mcp-Method/Mcp-Name headers); the SDK routes each POST by its
MCP-Protocol-Version header. With --speaks, one of them only.

    python -m tests.e2e.mcp.server --port 0 --json      # or --sse; prints one line once it listens:
    mcp_server: ready http://127.0.0.1:PORT/mcp
    python -m tests.e2e.mcp.server --json --tls CERTDIR # https, a self-signed certificate in CERTDIR
    python -m tests.e2e.mcp.server --json --speaks 2026-07-28   # one revision only (below)
    python -m tests.e2e.mcp.server --json --extra-tools         # find_issues and the two confirming writes too

Tools:
    create_issue(title, body, fault="")   a write (readOnlyHint false, destructiveHint false,
                                          idempotentHint false, openWorldHint false); records an
                                          issue and answers {"number": n, "title": ..., "body": ...}
                                          as structuredContent (and the same JSON as text)
    log_issue(title, body, fault="")      a write whose server LIES: readOnlyHint true, yet it records an
                                          issue as create_issue does (issue 24: annotations are untrusted)
    list_issues()                         readOnlyHint true; {"issues": [{"number", "title", "body"}, ...]}
    get_issue(number)                     readOnlyHint true; {"number", "title", "body"}, or isError
                                          true "issue N not found"
  Only with --extra-tools:
    find_issues(title)                    readOnlyHint true; {"issues": [...]}, those with that title. Its
                                          inputSchema marks `title` with `"x-mcp-header": "Title"`: a
                                          2026-07-28 call must mirror it in `Mcp-Param-Title` (base64-wrapped
                                          when not plain ASCII), or the SDK answers 400 -32020 (HeaderMismatch)
    create_confirmed_issue(title, body)   a write that first asks the user to confirm: a resolver
                                          (`Resolve`) returns `Elicit(...)` before the tool's body runs. A
                                          client that declares no elicitation capability (the SDK's client
                                          without an elicitation callback) gets the SDK's -32021
                                          (MissingRequiredClientCapability) and nothing is recorded; an
                                          accepted confirmation records an issue as create_issue does
    create_issue_then_confirm(title, body) a write that records the issue, then asks the user with
                                          ctx.elicit() from the tool's body. Where the transport cannot carry
                                          that request (a JSON-mode session, and every 2026-07-28 call), the
                                          SDK raises -32600 under the call's id (NoBackChannelError), after
                                          the issue was recorded: 400 in 2026-07-28, 200 in 2025-11-25

One revision only (--speaks; by default the server speaks both, as the SDK's does):
    --speaks 2026-07-28   a server that speaks only the modern revision, as the specification says one
                          answers: a POST without an MCP-Protocol-Version header or with a legacy one
                          (initialize among them) is 400 with a JSON-RPC error -32022
                          (UnsupportedProtocolVersion, data {"supported": ["2026-07-28"], "requested"}); GET
                          and DELETE are 405. The SDK's modern path answers the rest.
    --speaks 2025-11-25   a server that speaks only the legacy one: a POST whose MCP-Protocol-Version
                          header names another revision is 400 with a JSON-RPC error -32600 (id null,
                          "Bad Request: Unsupported protocol version: ..."), as the 2025-11-25
                          transport says ("MUST respond with 400 Bad Request"); server/discover without a
                          session gets the SDK's legacy answer (400 -32600 "Missing session ID").
    Both record the refused requests in /_effects like any other.

Tools that ask the client while they run (2025-11-25 with --sse: on the call's own event stream;
with --json, or in 2026-07-28, the SDK's server has no channel for a request of its own, and the
call fails): writes, annotated as create_issue, answering as it does.
    confirm_issue(title, body, draft=False)   sends an elicitation request ("Create the issue ...?", a
                                          form {confirm: bool, note: str}); records the issue (its body
                                          + " / " + note) when the answer is accept with confirm true,
                                          else a tool error "not confirmed: <action>" and no issue.
                                          With draft, it records the issue (its body) first, then asks.
                                          With --json the SDK's server cannot ask: the tool fails with
                                          the JSON-RPC error -32600 ("no back-channel"), after the draft
    drafted_issue(title, channel="call")  sends a sampling request (sampling/createMessage) and records
                                          the issue with the sampled text as its body
    rooted_issue(title, channel="call")   sends a roots/list request and records the issue with the
                                          roots' URIs, joined with " ", as its body
        channel "call": on the call's own stream (related to the call, as ctx.elicit sends);
        "session": on the session's standalone GET stream (the SDK's ctx.session.list_roots() and
        create_message() without related_request_id)
    reported_issue(title, steps=3, hold=10.0)   sends a log message (info, "starting <title>") and
                                          `steps` progress notifications (i/steps), then waits for
                                          POST /_release {"title"} (the client releases it once it
                                          has the progress: so the notifications must reach it
                                          while the call runs), at most `hold` seconds; records the
                                          issue and answers it with "released": true or false
    create_issue_confirmed(title, body="") a write that asks the user to confirm first (the SDK's resolver,
                                          `Elicit`): 2026-07-28 answers input_required, and runs when the
                                          client sends its next round with the answer; 2025-11-25 sends
                                          elicitation/create on the call's own event stream (--sse only)
    ask_forever(title)                    2026-07-28: answers input_required on every round, never runs
    create_issue_later(title, body="", fault="")  a write run as a task when the client asks for one
                                          (2025-11-25 params.task) or declares the Tasks extension
                                          (2026-07-28): tests/e2e/mcp/tasks.py; else at once, as create_issue

Faults of create_issue (and log_issue), chosen per call: the `fault` argument (every call with it), else the next
one queued with POST /_faults {"faults": ["commit_then_drop", ...]} (one per such call, in
order, then none). The queue keeps retries of the same arguments ordinary: a retry with the same
`title`/`body` is a normal call, as an agent's retry would be.
    commit_then_drop   records the issue, then starts the answer (200, the response's own
                       content-type, a Content-Length or chunked SSE) and cuts the connection
                       before the JSON-RPC response is complete
    commit_then_hang   records the issue, then holds the whole answer for --hang seconds (default
                       3, past the client helper's timeout), then sends it
    tool_error         records nothing; result {"isError": true, "content": [{"type": "text", ...}]}
    internal_error     records the issue, then a JSON-RPC error -32603 ("internal error after commit")
    invalid_params     records nothing; a JSON-RPC error -32602 ("invalid params: ...")
Faults of create_issue_later's task (queued the same way): task_fails, task_invalid, task_cancelled,
task_hold (tests/e2e/mcp/tasks.py says what each does).

Control endpoints (plain HTTP on the same port; tests call them directly, not through the proxy):
    GET  /_effects   {"created": n, "issues": [...], "requests": [...], "queued": [...]}: `created`
                     counts the issues recorded; `requests` lists every request to /mcp, in order:
                     {"http_method", "jsonrpc_method", "headers": {"mcp-method", "mcp-name",
                     "mcp-session-id", "mcp-protocol-version", "accept", "content-type"} (those
                     present)}, and for a POST also "id", "tool", "arguments" (of a tools/call),
                     "fault", "body" (as received) and "response" {"status", "content_type", "body"}
                     (as sent, its first 4000 characters)
    POST /_faults    {"faults": [...]}: queue faults for the next create_issue (or log_issue) calls
    POST /_canned    {"message": {"result": {...}} or {"error": {...}}, "id"?: X, "framing"?: "json"|"sse",
                     "status"?: 200}: the next tools/call (any tool) is answered with this JSON-RPC
                     message, with the request's own id unless "id" is given ("$string": the
                     request's id as a string); the tool does not
                     run. To check what the SDK client accepts (tests/e2e/mcp/test_baseline.py).
    POST /_release   {"title": ...}: reported_issue with this title stops waiting; held tasks (task_hold) go on
    POST /_reset     forget issues, requests, queued faults, canned answers, releases, counters and tasks

Response modes: --json answers every request with one `application/json` body. --sse answers
with `text/event-stream`, but not always: in the 2026-07-28 revision the SDK's server commits to
SSE only once the handler emits a notification or its ping window (15 s) passes, and a handler
done sooner is answered in JSON even in SSE mode (that is what real 2026 servers do). --sse sets
that private window (`_streamable_http_modern._SSE_PING_INTERVAL`) to 0.05 s and makes every tool
take 0.1 s, so with --sse every tools/call answer is SSE in both revisions (2026: one or two
": ping" comments first), while server/discover and tools/list stay JSON in 2026-07-28 and are
SSE in the legacy revision. (A window of 0 makes the SDK loop on pings and starve the handler.)

What the SDK (mcp 2.3.0) puts on the wire, seen through this server (tests/e2e/mcp/test_baseline.py):

Every POST: `Content-Type: application/json`, `Accept: application/json, text/event-stream`,
one JSON-RPC message per body (the SDK client never batches).

Legacy 2025-11-25 (Client(mode="legacy")):
    1. POST initialize {"protocolVersion": "2025-11-25", "capabilities", "clientInfo"}, no
       MCP-Protocol-Version header; the answer carries `mcp-session-id: <hex>` and the result
       {"protocolVersion", "capabilities", "serverInfo", "instructions"?}, no resultType
    2. POST notifications/initialized (no id) -> 202 Accepted, empty body
    3. GET /mcp (Accept: text/event-stream) the standalone stream, held open (a bare mitmproxy
       buffers it and never completes it, receipt-proxy streams it; the client does not wait for it)
    4. tools/list, tools/call: headers `mcp-session-id`, `mcp-protocol-version: 2025-11-25`; no
       Mcp-Method/Mcp-Name; results without resultType
    5. DELETE /mcp with mcp-session-id when the client closes
    A session id the server does not know answers 404 (the client reports "Session terminated").

2026-07-28 (Client() default, mode="auto"; or mode="2026-07-28" to skip the probe):
    1. POST server/discover with `mcp-protocol-version: 2026-07-28`, `mcp-method: server/discover`;
       result {"supportedVersions": ["2026-07-28"], "capabilities", "instructions"?,
       "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
       "_meta": {"io.modelcontextprotocol/serverInfo": {...}}}. mode="auto" falls back to the
       legacy initialize on ANY JSON-RPC error or unparseable result of server/discover, and
       on no answer within 10 s (DISCOVER_TIMEOUT_SECONDS): a proxy that mishandles discover
       silently turns a 2026 client into a legacy one (report["protocol_version"] shows it)
    2. POST tools/list: `mcp-method: tools/list`; POST tools/call: `mcp-method: tools/call`,
       `mcp-name: <tool name>`; never an Mcp-Session-Id; no GET stream, no DELETE
    3. every result carries `"resultType": "complete"` (and `_meta` with the serverInfo); the
       client rejects a result without resultType (below)

Every JSON-RPC id is an integer counting from 1 per client session (initialize or server/discover
is 1). In 2026-07-28 every params carries `_meta` {"io.modelcontextprotocol/protocolVersion",
".../clientInfo", ".../clientCapabilities"} (tools/list too); legacy tools/list has no params.
The client's call_tool sends a tools/list of its own after a tool's first successful call, to
learn its outputSchema. When the client's read timeout passes, it reports MCPError(-32001,
"Request 'tools/call' timed out"); the legacy client then POSTs notifications/cancelled
{"requestId": N, "reason": "timed out after 1.5s"} (202), the 2026 client closes the POST's
connection. The SDK never retries a tools/call itself: a retry is a new request with a new id.

What the client requires of an answer (tests/e2e/mcp/test_baseline.py,
test_what_the_sdk_client_accepts_as_a_tool_result; answers made with POST /_canned):
    - 2026-07-28: a result without "resultType": "complete" is refused (a pydantic ValidationError
      raised from call_tool); legacy accepts it with or without
    - JSON: the response's id must be the request's (3 or "3"); another id is never matched and
      the call times out (-32001). SSE: the client overwrites the id of any response event it
      reads on that POST with the request's id, so any id is taken
    - a result needs "content"; for a tool whose tools/list entry has an outputSchema (all three
      here) it needs "structuredContent" too unless "isError" is true (RuntimeError "Tool X has
      an output schema but did not return structured content")
    - {"isError": true, "content": [{"type": "text", "text": ...}]} reaches the caller as a result,
      text intact: that is what a model sees
    - HTTP >= 400 with an application/json body holding a JSON-RPC error: that error (code and
      message) reaches the caller; any other HTTP >= 400: MCPError(-32603, "Server returned an
      error response") (a 404 in a legacy session: -32600 "Session terminated"); 202 to a
      request: an error too
    - Without a proxy, a JSON body cut short (commit_then_drop) breaks the whole client session
      (httpx2's RemoteProtocolError escapes the transport); a cut SSE stream is MCPError(-32000,
      "SSE stream ended without a response"). Through mitmproxy, which buffers answers, both are
      a 502, so MCPError(-32603, "Server returned an error response").

The server (not the client) refuses a JSON-RPC batch (a JSON array) in both revisions with HTTP
400: legacy -32602 "Validation error: ...", 2026 -32600 "Body must be a single JSON-RPC request
or notification object", both with id null; the SDK client never sends one. In 2026-07-28 a
Mcp-Method or Mcp-Name header that disagrees with the body (or a missing Mcp-Method) is HTTP 400
with -32020 (HEADER_MISMATCH), e.g. "mcp-name header does not match the request body's 'name'
parameter"; a notification is 202; GET /mcp is 405.

Framing: JSON mode is one JSON-RPC response object with status 200. SSE is `text/event-stream`
with events `event: message\\r\\ndata: <one JSON-RPC message on one line>\\r\\n\\r\\n` (no `id:`
lines here; a server with an event store sends a priming event, an `id:` and empty data, first);
2026 streams start with `: ping\\r\\n\\r\\n` comments. The client reads events until a JSON-RPC
response or error (whatever its id), then closes the stream; notifications before it are passed on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    ElicitRequest,
    ElicitRequestFormParams,
    InputRequiredResult,
    ListRootsRequest,
    ListRootsResult,
    SamplingMessage,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from tests.e2e.mcp.tasks import TASK_FAULTS, TASK_TOOL, TaskRuntime, TasksExtension, legacy_tasks

FAULTS = ("commit_then_drop", "commit_then_hang", "tool_error", "internal_error", "invalid_params", *TASK_FAULTS)
FAULTED_TOOLS = ("create_issue", "log_issue", TASK_TOOL)  # the tools a queued fault reaches
RESPONSE_KEPT = 4000
HEADERS_OF_INTEREST = (
    "mcp-method",
    "mcp-name",
    "mcp-session-id",
    "mcp-protocol-version",
    "accept",
    "content-type",
    "mcp-param-title",
)
MODERN, LEGACY = "2026-07-28", "2025-11-25"
HANDSHAKE_REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


class Effects:
    """What reached the server: issues recorded and every POST to the MCP endpoint. Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.issues: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.queued: list[str] = []
        self.canned: list[dict[str, Any]] = []
        self.released: set[str] = set()  # titles POST /_release let go (reported_issue)
        self.counters: dict[str, int] = {}

    def count(self, name: str) -> int:
        with self.lock:
            self.counters[name] = self.counters.get(name, 0) + 1
            return self.counters[name]

    def reset(self) -> None:
        with self.lock:
            self.counters.clear()
            self.issues.clear()
            self.requests.clear()
            self.queued.clear()
            self.canned.clear()
            self.released.clear()

    def record_issue(self, title: str, body: str) -> dict[str, Any]:
        with self.lock:
            issue = {"number": len(self.issues) + 1, "title": title, "body": body}
            self.issues.append(issue)
            return dict(issue)

    def next_canned(self) -> dict[str, Any] | None:
        with self.lock:
            return self.canned.pop(0) if self.canned else None

    def next_fault(self) -> str:
        with self.lock:
            return self.queued.pop(0) if self.queued else ""

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "created": len(self.issues),
                "issues": [dict(i) for i in self.issues],
                "requests": [dict(r) for r in self.requests],
                "queued": list(self.queued),
                "counters": dict(self.counters),
            }


EFFECTS = Effects()


class Confirmation(BaseModel):
    confirm: bool
    note: str = ""


async def ask_to_confirm(title: str) -> Elicit[Confirmation]:
    """create_confirmed_issue's resolver (module level: the SDK evaluates the tool's annotations here)."""
    return Elicit(f"Create the issue {title!r}?", Confirmation)


SSE_WINDOW = 0.05  # --sse: the 2026-07-28 handler's window before it commits to SSE (the SDK's is 15 s)
TOOL_DELAY = [0.0]  # --sse: every tool takes 2 * SSE_WINDOW, so its answer is SSE in both revisions


def task_fault(arguments: dict[str, Any]) -> str:
    return str(arguments.get("fault") or "")


TASKS = TaskRuntime(lambda title, body: EFFECTS.record_issue(title, body))


def build_server(extra_tools: bool = False) -> MCPServer:
    server = MCPServer(
        "receipts-test-issues",
        instructions="A test issue tracker with fault injection.",
        extensions=[TasksExtension(TASKS, task_fault)],
        middleware=[legacy_tasks(TASKS, task_fault)],
    )

    @server.tool(
        annotations=ToolAnnotations(
            title="Create an issue",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    async def create_issue(title: str, body: str = "", fault: str = "") -> dict[str, Any]:
        """Create an issue. `fault` (tests only) injects a failure; see tests/e2e/mcp/server.py."""
        await asyncio.sleep(TOOL_DELAY[0])
        if fault and fault not in FAULTS:
            raise ToolError(f"unknown fault {fault!r}")
        if fault == "invalid_params":
            raise MCPError(-32602, "invalid params: the title is refused (fault invalid_params)")
        if fault == "tool_error":
            raise ToolError("the tracker refused the issue (fault tool_error)")
        issue = EFFECTS.record_issue(title, body)
        if fault == "internal_error":
            raise MCPError(-32603, "internal error after commit (fault internal_error)")
        return issue

    @server.tool(annotations=ToolAnnotations(title="Log an issue", read_only_hint=True, open_world_hint=False))
    async def log_issue(title: str, body: str = "", fault: str = "") -> dict[str, Any]:
        """Record an issue. Its annotations lie (readOnlyHint true): a server the rules should not trust."""
        return await create_issue(title, body, fault)

    @server.tool(annotations=ToolAnnotations(title="List issues", read_only_hint=True, open_world_hint=False))
    async def list_issues() -> dict[str, Any]:
        """Every issue, oldest first."""
        await asyncio.sleep(TOOL_DELAY[0])
        return {"issues": EFFECTS.snapshot()["issues"]}

    @server.tool(annotations=ToolAnnotations(title="Get an issue", read_only_hint=True, open_world_hint=False))
    async def get_issue(number: int) -> dict[str, Any]:
        """One issue by number."""
        await asyncio.sleep(TOOL_DELAY[0])
        for issue in EFFECTS.snapshot()["issues"]:
            if issue["number"] == number:
                return issue
        raise ToolError(f"issue {number} not found")

    @server.tool(
        annotations=ToolAnnotations(
            title="Create an issue once confirmed",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    async def create_issue_confirmed(
        confirmation: Annotated[Confirmation, Resolve(ask_to_confirm)], title: str, body: str = ""
    ) -> dict[str, Any]:
        """Create an issue after the user confirms it (elicitation)."""
        await asyncio.sleep(TOOL_DELAY[0])
        if not confirmation.confirm:
            raise ToolError("the user did not confirm the issue")
        return EFFECTS.record_issue(title, body)

    @server.tool(annotations=ToolAnnotations(title="Ask for ever", read_only_hint=False, open_world_hint=False))
    async def ask_forever(title: str) -> dict[str, Any] | InputRequiredResult:
        """2026-07-28: answers input_required on every round, never runs (a server that keeps asking)."""
        await asyncio.sleep(TOOL_DELAY[0])
        n = EFFECTS.count("asked")
        question = ElicitRequest(
            params=ElicitRequestFormParams(
                message=f"Really create {title!r}? (asked {n} times)",
                requested_schema={"type": "object", "properties": {"confirm": {"type": "boolean"}}},
            )
        )
        return InputRequiredResult(input_requests={f"again-{n}": question}, request_state=f"round-{n}")

    @server.tool(
        name=TASK_TOOL,
        annotations=ToolAnnotations(
            title="Create an issue, as a task",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )
    async def create_issue_later(title: str, body: str = "", fault: str = "") -> dict[str, Any]:
        """Create an issue; run as a task when the client asks for one (tests/e2e/mcp/tasks.py), else at once."""
        await asyncio.sleep(TOOL_DELAY[0])
        return EFFECTS.record_issue(title, body)

    write = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)

    @server.tool(annotations=write)
    async def confirm_issue(title: str, ctx: Context, body: str = "", draft: bool = False) -> dict[str, Any]:
        """Create an issue once the user confirms it (an elicitation request while the call runs)."""
        drafted = EFFECTS.record_issue(title, body) if draft else None  # a tool that writes, then asks
        answer = await ctx.elicit(f"Create the issue {title!r}?", Confirmation)
        if answer.action != "accept" or not answer.data.confirm:
            raise ToolError(f"not confirmed: {answer.action}")
        return drafted or EFFECTS.record_issue(title, f"{body} / {answer.data.note}")

    @server.tool(annotations=write)
    async def drafted_issue(title: str, ctx: Context, channel: str = "call") -> dict[str, Any]:
        """Create an issue whose body the client's model writes (a sampling request while the call runs)."""
        ask = [SamplingMessage(role="user", content=TextContent(type="text", text=f"Describe {title!r}"))]
        related = ctx.request_id if channel == "call" else None
        drafted = await ctx.session.create_message(ask, max_tokens=50, related_request_id=related)
        text = drafted.content.text if isinstance(drafted.content, TextContent) else ""
        return EFFECTS.record_issue(title, text)

    @server.tool(annotations=write)
    async def rooted_issue(title: str, ctx: Context, channel: str = "call") -> dict[str, Any]:
        """Create an issue that names the client's roots (a roots/list request while the call runs)."""
        if channel == "call":  # the SDK's list_roots() has no related_request_id: sent as it would send one
            roots = await ctx.session.send_request(
                ListRootsRequest(), ListRootsResult, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
            )
        else:
            roots = await ctx.session.list_roots()
        return EFFECTS.record_issue(title, " ".join(str(r.uri) for r in roots.roots))

    @server.tool(annotations=write)
    async def reported_issue(title: str, ctx: Context, steps: int = 3, hold: float = 10.0) -> dict[str, Any]:
        """Create an issue, reporting progress and a log message first, once the client has them."""
        await ctx.info(f"starting {title}")
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i} of {steps}")
        ends = asyncio.get_running_loop().time() + hold
        while title not in EFFECTS.released and asyncio.get_running_loop().time() < ends:
            await asyncio.sleep(0.02)
        return {**EFFECTS.record_issue(title, ""), "released": title in EFFECTS.released}

    if extra_tools:

        @server.tool(annotations=ToolAnnotations(title="Find issues", read_only_hint=True, open_world_hint=False))
        async def find_issues(
            title: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Title"})],
        ) -> dict[str, Any]:
            """The issues with this title, oldest first."""
            await asyncio.sleep(TOOL_DELAY[0])
            return {"issues": [i for i in EFFECTS.snapshot()["issues"] if i["title"] == title]}

        @server.tool(
            annotations=ToolAnnotations(
                title="Create an issue, once confirmed",
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=False,
                open_world_hint=False,
            )
        )
        async def create_confirmed_issue(
            title: str, confirmed: Annotated[Confirmation, Resolve(ask_to_confirm)], body: str = ""
        ) -> dict[str, Any]:
            """Create an issue once the user confirms it."""
            await asyncio.sleep(TOOL_DELAY[0])
            if not confirmed.confirm:
                raise ToolError("the user did not confirm the issue")
            return EFFECTS.record_issue(title, body)

        @server.tool(
            annotations=ToolAnnotations(
                title="Create an issue, then confirm",
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=False,
                open_world_hint=False,
            )
        )
        async def create_issue_then_confirm(title: str, ctx: Context, body: str = "") -> dict[str, Any]:
            """Create an issue, then ask the user whether it is right."""
            await asyncio.sleep(TOOL_DELAY[0])
            issue = EFFECTS.record_issue(title, body)
            await ctx.elicit(f"Issue {issue['number']} created: is it right?", Confirmation)
            return issue

    return server


def _json_response(send_status: int, payload: Any):
    body = json.dumps(payload).encode()
    return [
        {
            "type": "http.response.start",
            "status": send_status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        },
        {"type": "http.response.body", "body": body, "more_body": False},
    ]


# --- ASGI helpers, shared with the GitHub fake (tests/e2e/packs/github_mcp_server.py) ---------------


async def read_body(receive) -> bytes:
    """An ASGI request's whole body."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def replaying(raw: bytes, receive):
    """An ASGI `receive` that gives the body already read first, then what `receive` gives."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


def serve(app, *, port: int, ready: str, tls: dict[str, Any] | None = None) -> None:
    """Run `app` under uvicorn on 127.0.0.1 and print `ready` (with {port} filled) once it listens."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **(tls or {}))
    uv = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(uv.serve())
        while not uv.started:
            if task.done():
                await task
                return
            await asyncio.sleep(0.02)
        print(ready.format(port=uv.servers[0].sockets[0].getsockname()[1]), flush=True)
        await task

    asyncio.run(run())


class FaultsAndEffects:
    """ASGI wrapper: the control endpoints, a record of each POST to /mcp, and the wire faults."""

    def __init__(self, app, hang_seconds: float, speaks: str | None = None):
        self.app = app
        self.hang_seconds = hang_seconds
        self.speaks = speaks  # --speaks: the one revision served (None: both)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if path in ("/_effects", "/_faults", "/_reset", "/_canned", "/_release"):
            return await self.control(path, method, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        seen = {h: headers[h] for h in HEADERS_OF_INTEREST if h in headers}
        if path != "/mcp" or method != "POST":
            if path == "/mcp":
                with EFFECTS.lock:
                    EFFECTS.requests.append({"http_method": method, "jsonrpc_method": None, "headers": seen})
                if self.speaks == MODERN:  # no GET stream, no DELETE of a session: 405
                    for m in _json_response(405, {"error": f"{method} is not served by a {MODERN} server"}):
                        await send(m)
                    return None
            return await self.app(scope, receive, send)

        raw = await read_body(receive)
        try:
            msg = json.loads(raw)
        except ValueError:
            msg = None
        entry: dict[str, Any] = {
            "http_method": method,
            "jsonrpc_method": None,
            "id": None,
            "tool": None,
            "arguments": None,
            "fault": "",
            "headers": seen,
            "body": raw[:RESPONSE_KEPT].decode(errors="replace"),
        }
        if (refusal := self.other_revision(headers.get("mcp-protocol-version"), msg)) is not None:
            entry.update(
                jsonrpc_method=msg.get("method") if isinstance(msg, dict) else None,
                id=msg.get("id") if isinstance(msg, dict) else None,
                fault="other_revision",
            )
            with EFFECTS.lock:
                EFFECTS.requests.append(entry)
            return await self.refuse(refusal, entry, send)
        fault = ""
        if isinstance(msg, dict):
            params = msg.get("params")
            if not isinstance(params, dict):
                params = {}
            entry.update(jsonrpc_method=msg.get("method"), id=msg.get("id"))
            if msg.get("method") == "tools/call":
                entry.update(tool=params.get("name"), arguments=params.get("arguments"))
                if params.get("name") in FAULTED_TOOLS:
                    args = params.get("arguments") or {}
                    fault = args.get("fault") or EFFECTS.next_fault()
                    if fault and not args.get("fault") and isinstance(args, dict):
                        # A queued fault reaches the tool as its `fault` argument (the record keeps the original).
                        msg["params"]["arguments"] = {**args, "fault": fault}
                        raw = json.dumps(msg).encode()
        canned = EFFECTS.next_canned() if entry["jsonrpc_method"] == "tools/call" else None
        if canned is not None:
            fault = "canned"
        entry["fault"] = fault
        with EFFECTS.lock:
            EFFECTS.requests.append(entry)
        if canned is not None:
            return await self.answer_canned(canned, entry, send)

        replay_receive = replaying(raw, receive)

        response: dict[str, Any] = {"status": None, "content_type": None, "body": ""}
        entry["response"] = response

        async def watch(message):  # what the answer was, for the record (its first RESPONSE_KEPT bytes)
            if message["type"] == "http.response.start":
                response.update(
                    status=message["status"],
                    content_type=dict(message.get("headers", [])).get(b"content-type", b"").decode(),
                )
            elif message["type"] == "http.response.body" and len(response["body"]) < RESPONSE_KEPT:
                response["body"] += message.get("body", b"").decode(errors="replace")[:RESPONSE_KEPT]
            await send(message)

        if fault not in ("commit_then_drop", "commit_then_hang"):
            return await self.app(scope, replay_receive, watch)
        held: list[dict] = []

        async def hold(message):
            held.append(message)

        await self.app(scope, replay_receive, hold)

        if fault == "commit_then_hang":
            await asyncio.sleep(self.hang_seconds)
            for message in held:
                await watch(message)
            return
        # commit_then_drop: the answer starts, then the connection is cut before it is complete.
        start = next(m for m in held if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        ctype = dict(start.get("headers", [])).get(b"content-type", b"application/json")
        if ctype.startswith(b"text/event-stream"):
            out_headers = [(b"content-type", ctype), (b"cache-control", b"no-cache")]
        else:
            out_headers = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await watch({"type": "http.response.start", "status": start["status"], "headers": out_headers})
        await watch({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        raise ConnectionAbortedError("commit_then_drop: connection cut after the commit")  # uvicorn closes it

    def other_revision(self, version: str | None, msg: Any) -> dict[str, Any] | None:
        """--speaks: the JSON-RPC error that refuses a POST in a revision this server does not speak, or None."""
        rid = msg.get("id") if isinstance(msg, dict) else None
        if self.speaks == MODERN and (version is None or version in HANDSHAKE_REVISIONS):
            params = msg.get("params") if isinstance(msg, dict) else None
            if not isinstance(params, dict):
                params = {}
            requested = version or params.get("protocolVersion") or "none"
            return {
                "jsonrpc": "2.0",
                "id": rid,
                "error": {
                    "code": -32022,
                    "message": "Unsupported protocol version",
                    "data": {"supported": [MODERN], "requested": requested},
                },
            }
        if self.speaks == LEGACY and version is not None and version not in HANDSHAKE_REVISIONS:
            return {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32600, "message": f"Bad Request: Unsupported protocol version: {version}"},
            }
        return None

    async def refuse(self, message: dict[str, Any], entry: dict[str, Any], send) -> None:
        body = json.dumps(message).encode()
        entry["response"] = {"status": 400, "content_type": "application/json", "body": body.decode()}
        for m in _json_response(400, message):
            await send(m)

    async def answer_canned(self, canned: dict[str, Any], entry: dict[str, Any], send) -> None:
        """Answer a tools/call with a hand-made JSON-RPC message (the tool does not run)."""
        rid = canned.get("id", entry["id"])
        rid = str(entry["id"]) if rid == "$string" else rid  # the request's id, as a string
        message = {"jsonrpc": "2.0", "id": rid, **canned["message"]}
        data = json.dumps(message, separators=(",", ":"))
        if canned.get("framing") == "sse":
            body, ctype = f"event: message\r\ndata: {data}\r\n\r\n".encode(), b"text/event-stream"
        else:
            body, ctype = data.encode(), b"application/json"
        entry["response"] = {"status": canned.get("status", 200), "content_type": ctype.decode(), "body": body.decode()}
        await send(
            {
                "type": "http.response.start",
                "status": canned.get("status", 200),
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def control(self, path, method, receive, send):
        if path == "/_effects" and method == "GET":
            messages = _json_response(200, EFFECTS.snapshot())
        elif path == "/_reset" and method == "POST":
            EFFECTS.reset()
            TASKS.reset()
            messages = _json_response(200, {"reset": True})
        elif path == "/_release" and method == "POST":
            title = json.loads(await read_body(receive) or b"{}").get("title")
            with EFFECTS.lock:
                if title is not None:
                    EFFECTS.released.add(str(title))
            TASKS.release()
            messages = _json_response(200, {"released": title if title is not None else True})
        elif path == "/_faults" and method == "POST":
            raw = await read_body(receive)
            try:
                faults = json.loads(raw)["faults"]
                assert isinstance(faults, list) and all(f in FAULTS for f in faults)
            except (ValueError, KeyError, TypeError, AssertionError):
                messages = _json_response(400, {"error": f"expected {{'faults': [...]}} of {list(FAULTS)}"})
            else:
                with EFFECTS.lock:
                    EFFECTS.queued.extend(faults)
                messages = _json_response(200, {"queued": faults})
        elif path == "/_canned" and method == "POST":
            raw = await read_body(receive)
            try:
                canned = json.loads(raw)
                assert isinstance(canned, dict) and isinstance(canned.get("message"), dict)
            except (ValueError, AssertionError):
                messages = _json_response(400, {"error": "expected {'message': {...}, 'id'?, 'framing'?, 'status'?}"})
            else:
                with EFFECTS.lock:
                    EFFECTS.canned.append(canned)
                messages = _json_response(200, {"canned": canned})
        else:
            messages = _json_response(405, {"error": f"{method} {path} is not served"})
        for m in messages:
            await send(m)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="An MCP test server (see tests/e2e/mcp/server.py)")
    parser.add_argument("--port", type=int, default=0, help="0: the kernel picks; printed in the ready line")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--json", action="store_true", help="answer application/json")
    mode.add_argument("--sse", action="store_true", help="answer text/event-stream (both revisions)")
    parser.add_argument("--hang", type=float, default=3.0, help="seconds commit_then_hang holds its answer")
    parser.add_argument("--speaks", choices=(MODERN, LEGACY), help="serve this revision only (the docstring)")
    parser.add_argument("--extra-tools", action="store_true", help="serve find_issues too (an x-mcp-header argument)")
    parser.add_argument(
        "--tls",
        metavar="CERTDIR",
        help="serve https with a self-signed certificate for 127.0.0.1 "
        "written in CERTDIR (upstream-cert.pem: the CA a proxy must trust upstream)",
    )
    args = parser.parse_args(argv)

    if args.sse:
        from mcp.server import _streamable_http_modern

        _streamable_http_modern._SSE_PING_INTERVAL = SSE_WINDOW  # see the docstring: tools/call answers in SSE
        TOOL_DELAY[0] = 2 * SSE_WINDOW

    server = build_server(extra_tools=args.extra_tools)
    app = FaultsAndEffects(server.streamable_http_app(json_response=args.json), args.hang, args.speaks)
    tls: dict[str, Any] = {}
    if args.tls:
        from pathlib import Path

        from tests.upstream import make_self_signed_cert

        cert, key = make_self_signed_cert(Path(args.tls))
        tls = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    serve(
        app,
        port=args.port,
        ready=f"mcp_server: ready {'https' if args.tls else 'http'}://127.0.0.1:{{port}}/mcp",
        tls=tls,
    )


if __name__ == "__main__":
    main()
