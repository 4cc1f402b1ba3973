"""
The official MCP SDK's own client (mcp 2.x, `mcp.Client`) in a subprocess, driven by a plan of
operations, printing one JSON report. Tests call `run_client(...)`, which returns that report.

    report = run_client("http://127.0.0.1:PORT/mcp", [("list_tools",), ("call", "create_issue", {...})],
                        revision="legacy" | "2026-07-28", proxy=proxy.url, ca=proxy.ca, timeout=2.0)

The proxy comes from the environment, as for any agent: HTTP_PROXY/HTTPS_PROXY (and lowercase)
are set to `proxy`, NO_PROXY/no_proxy are emptied so 127.0.0.1 is not excluded, and `ca`
(mitmproxy's CA) is given as SSL_CERT_FILE, which the SDK's HTTP client (httpx2, trust_env)
reads as an agent's would. Without `proxy`, the proxy variables are removed. The client is the
SDK's own transport (`streamable_http_client`) with an httpx2.AsyncClient of ours, built as the
SDK's default one but with event hooks (the "http" list below) and timeouts above `timeout`.

revision:
    "legacy"       Client(mode="legacy"): initialize, notifications/initialized, Mcp-Session-Id
    "2026-07-28"   Client(mode="auto"), the SDK's default: server/discover, then 2026-07-28

Operations, run in order in one client session; one that fails does not stop the next:
    ("list_tools",)                     -> {"op", "ok", "tools": [{"name", "annotations"}]}
    ("call", name, arguments)           -> {"op", "ok", "is_error", "content": [...],
                                            "structured": {...}|None, "result": <the result as dumped>}
    ("call_task", name, arguments)      a task: 2026-07-28, as "call" (the TasksClient extension polls it,
                                        tests/e2e/mcp/tasks.py); 2025-11-25, a task-augmented call polled with
                                        tasks/get, then tasks/result -> as "call"
    ("task_handle", name, arguments)    the task handle, not polled -> {"op", "ok", "handle": {...}}
    ("poll_task", task_id)              -> as "call"
    ("call_input", name, arguments)     2026-07-28: one round; an input_required result returned as it is
                                        -> {"op", "ok", "result_type", "result"}
    ("continue", name, arguments, request_state, keys)  its next round, every key answered "confirm"
    a failure                           -> {"op", "ok": false, "error": {"type", "code", "message"}}
The client answers elicitations as the plan's "answers" say (their messages in the report's "elicitations") and
declares the Tasks extension (the task ids it was handed in "tasks").
The report: {"revision", "protocol_version", "connect_error"?, "results": [...],
"http": [{"method", "url", "jsonrpc_method", "id", "status", "content_type", "session_id",
"request_headers": {...}}]} where "http" lists every HTTP exchange the client made (httpx2 event
hooks), `status` None when no answer came. Note the SDK's call_tool sends a tools/list of its own
after a tool's first successful call (to learn its outputSchema), and mode "auto" sends
server/discover first.
`timeout` is the client's read timeout per request (`read_timeout_seconds`), in seconds; `headers`
are sent on every request (e.g. an Authorization header, as an agent configures one).

The server's own requests and notifications (tests/e2e/mcp/server.py's confirm_issue, drafted_issue,
rooted_issue, reported_issue) reach the SDK's callbacks, given by `answers` (each one given is
declared as a capability; one not given is the SDK's default):
    {"elicit": {"action": "accept", "content": {...}}}   the elicitation callback's answer
    {"sample": "text"}                                   the sampling callback's (a text message)
    {"roots": ["file:///..."]}                           the list-roots callback's
Each request the client got is listed in report["asked"]: {"kind": "elicit"|"sample"|"roots",
"op": the index of the operation running, "message"?: the elicitation's or the sampling's text}.
Log messages (the logging callback) are listed in report["logs"]: {"level", "data", "op"};
`log_level` opts in to them in 2026-07-28 (Client(log_level=...)). Every call has a progress
callback: its notifications are the call's result["progress"] [[progress, total, message], ...];
with `release` (a URL of the server's, POST /_release), the callback sends {"title": <the call's
title>} there, directly (never through the proxy), once progress reaches total.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

REVISIONS = ("legacy", "2026-07-28")
INTERESTING = ("mcp-method", "mcp-name", "mcp-session-id", "mcp-protocol-version", "accept", "content-type")


def run_client(
    url: str,
    ops: list[tuple],
    *,
    revision: str,
    proxy: str | None = None,
    ca: Path | str | None = None,
    timeout: float = 5.0,
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    answers: dict[str, Any] | None = None,
    log_level: str | None = None,
    release: str | None = None,
) -> dict[str, Any]:
    """Run the SDK client in a subprocess (see the module docstring); return its JSON report."""
    assert revision in REVISIONS, revision
    child_env = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "ssl_cert_file")
    }
    if proxy:
        child_env.update(
            HTTP_PROXY=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, https_proxy=proxy, NO_PROXY="", no_proxy=""
        )
    if ca:
        child_env["SSL_CERT_FILE"] = str(ca)
    child_env.update(env or {})
    plan = json.dumps(
        {
            "url": url,
            "ops": ops,
            "revision": revision,
            "timeout": timeout,
            "headers": headers or {},
            "answers": answers or {},
            "log_level": log_level,
            "release": release,
        }
    )
    budget = 20 + timeout * (len(ops) + 2)
    p = subprocess.run(
        [sys.executable, "-m", "tests.e2e.mcp.client"],
        input=plan.encode(),
        capture_output=True,
        env=child_env,
        cwd=ROOT,
        timeout=budget,
    )
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    if p.returncode != 0 or not lines:
        raise AssertionError(f"the MCP client exited with {p.returncode}:\n{p.stderr.decode(errors='replace')}")
    return json.loads(lines[-1])


def _error(exc: BaseException) -> dict[str, Any]:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _error(exc.exceptions[0])
    if isinstance(exc, MCPError):
        return {"type": type(exc).__name__, "code": exc.code, "message": exc.message}
    return {"type": type(exc).__name__, "code": None, "message": str(exc)[:500]}


async def _run(plan: dict[str, Any]) -> dict[str, Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http: list[dict[str, Any]] = []

    async def on_request(request: httpx2.Request) -> None:
        request.extensions["report_index"] = len(http)
        try:
            message = json.loads(request.content) if request.content else {}
        except (ValueError, httpx2.RequestNotRead):
            message = {}
        message = message if isinstance(message, dict) else {}
        http.append(
            {
                "method": request.method,
                "url": str(request.url),
                "status": None,
                "content_type": None,
                "jsonrpc_method": message.get("method"),
                "id": message.get("id"),
                "request_headers": {h: request.headers[h] for h in INTERESTING if h in request.headers},
            }
        )

    async def on_response(response: httpx2.Response) -> None:
        i = response.request.extensions.get("report_index")
        if i is not None:
            http[i].update(
                status=response.status_code,
                content_type=response.headers.get("content-type"),
                session_id=response.headers.get("mcp-session-id"),
            )

    elicitations: list[str] = []  # the messages of the elicitation requests the user was asked
    report_tasks: list[str] = []

    timeout = float(plan["timeout"])
    # trust_env (the default): the proxy from HTTP(S)_PROXY, the CA from SSL_CERT_FILE (httpcore2 reads it).
    http_client = httpx2.AsyncClient(
        timeout=httpx2.Timeout(timeout + 5, read=timeout + 5),
        headers=plan.get("headers") or {},
        event_hooks={"request": [on_request], "response": [on_response]},
    )
    revision = plan["revision"]
    report: dict[str, Any] = {
        "revision": revision,
        "protocol_version": None,
        "results": [],
        "http": http,
        "asked": [],
        "logs": [],
        "elicitations": elicitations,
        "tasks": report_tasks,
    }
    try:
        async with http_client:
            from tests.e2e.mcp.tasks import TasksClient

            tasks = TasksClient()
            transport = streamable_http_client(plan["url"], http_client=http_client)
            client = Client(
                transport,
                mode="legacy" if revision == "legacy" else "auto",
                read_timeout_seconds=timeout,
                cache=None,
                log_level=plan.get("log_level"),
                extensions=[tasks],
                **_callbacks(plan.get("answers") or {}, report),
            )
            async with client:
                report["protocol_version"] = client.protocol_version
                for op in plan["ops"]:
                    report["results"].append(await _op(client, op, report_tasks, plan.get("release")))
                report_tasks.extend(tasks.seen)
    except BaseException as exc:  # the report says what the client raised (a group of one: that one)
        if isinstance(exc, KeyboardInterrupt):
            raise
        report["connect_error" if not report["results"] else "close_error"] = _error(exc)
    return report


def _callbacks(answers: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The SDK client's callbacks: each answers as `answers` says, and notes what it was asked."""
    import mcp_types as types

    def op() -> int:
        return len(report["results"])  # the index of the operation running

    async def elicit(_context, params):
        report["asked"].append({"kind": "elicit", "op": op(), "message": params.message})
        report["elicitations"].append(params.message)
        return types.ElicitResult(**answers["elicit"])

    async def sample(_context, params):
        asked = params.messages[0].content
        report["asked"].append({"kind": "sample", "op": op(), "message": getattr(asked, "text", None)})
        return types.CreateMessageResult(
            role="assistant", model="test-model", content=types.TextContent(type="text", text=answers["sample"])
        )

    async def roots(_context):
        report["asked"].append({"kind": "roots", "op": op()})
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in answers["roots"]])

    async def log(params):
        report["logs"].append({"level": params.level, "data": params.data, "op": op()})

    given = {
        "elicitation_callback": elicit if "elicit" in answers else None,
        "sampling_callback": sample if "sample" in answers else None,
        "list_roots_callback": roots if "roots" in answers else None,
    }
    return {"logging_callback": log, **{k: v for k, v in given.items() if v is not None}}


def _dumped(result) -> dict[str, Any]:
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {
        "ok": True,
        "is_error": bool(getattr(result, "is_error", False)),
        "content": dumped.get("content"),
        "structured": dumped.get("structuredContent"),
        "result": dumped,
    }


async def _op(client, op: list, tasks: list[str], release: str | None = None) -> dict[str, Any]:
    from tests.e2e.mcp.tasks import poll_task

    kind = op[0]
    legacy = client.protocol_version == "2025-11-25"
    progress: list[list[Any]] = []  # a call's progress notifications, as its progress callback got them
    try:
        if kind == "call_task" and legacy:  # 2025-11-25: a task-augmented call, polled to its end
            _, name, arguments = op
            created = await client.session._dispatcher.send_raw_request(
                "tools/call", {"name": name, "arguments": arguments, "task": {"ttl": 600000}}
            )
            if not isinstance(created.get("task"), dict):  # answered at once (a replay, the proxy's refusal)
                from mcp_types import CallToolResult

                return {"op": kind, "tool": name, **_dumped(CallToolResult.model_validate(created))}
            task_id = created["task"]["taskId"]
            tasks.append(task_id)
            return {"op": kind, "tool": name, **_dumped(await poll_task(client.session, task_id, legacy=True))}
        if kind == "call_task":  # 2026-07-28: the tasks extension's claim polls it (TasksClient)
            _, name, arguments = op
            return {"op": kind, "tool": name, **_dumped(await client.call_tool(name, arguments))}
        if kind == "task_handle":  # the task handle, not polled
            _, name, arguments = op
            if legacy:
                created = await client.session._dispatcher.send_raw_request(
                    "tools/call", {"name": name, "arguments": arguments, "task": {"ttl": 600000}}
                )
                handle = created["task"]
            else:
                result = await client.session.call_tool(name, arguments, allow_claimed=True)
                handle = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            tasks.append(handle["taskId"])
            return {"op": kind, "tool": name, "ok": True, "handle": handle}
        if kind == "poll_task":
            _, task_id = op
            return {"op": kind, **_dumped(await poll_task(client.session, task_id, legacy=legacy))}
        if kind == "call_input":  # 2026-07-28: one round, an input_required result returned as it is
            _, name, arguments = op
            result = await client.session.call_tool(name, arguments, allow_input_required=True)
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            return {"op": kind, "tool": name, "ok": True, "result_type": dumped.get("resultType"), "result": dumped}
        if kind == "continue":  # 2026-07-28: the next round of a call_input, with the user's confirmation
            _, name, arguments, request_state, keys = op
            from mcp_types import ElicitResult

            responses = {k: ElicitResult(action="accept", content={"confirm": True}) for k in keys}
            result = await client.session.call_tool(
                name, arguments, input_responses=responses, request_state=request_state, allow_input_required=True
            )
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            return {"op": kind, "tool": name, "result_type": dumped.get("resultType"), **_dumped(result)}
        if kind == "list_tools":
            listed = await client.list_tools()
            return {
                "op": kind,
                "ok": True,
                "tools": [
                    {
                        "name": t.name,
                        "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True)
                        if t.annotations
                        else None,
                    }
                    for t in listed.tools
                ],
            }
        if kind == "call":
            _, name, arguments = op

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append([done, total, message])
                if release and total is not None and done >= total:
                    await _release(release, arguments.get("title"))

            result = await client.call_tool(name, arguments, progress_callback=on_progress)
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            return {
                "op": kind,
                "tool": name,
                "ok": True,
                "is_error": bool(getattr(result, "is_error", False)),
                "content": dumped.get("content"),
                "structured": dumped.get("structuredContent"),
                "result": dumped,
                "progress": progress,
            }
        raise ValueError(f"unknown operation {op!r}")
    except Exception as exc:
        return {"op": kind, "ok": False, "error": _error(exc), "progress": progress}


async def _release(url: str, title: Any) -> None:
    """POST {"title"} to the server's /_release, directly: never through the proxy under test."""
    import urllib.request

    import anyio

    def post() -> None:
        req = urllib.request.Request(
            url, data=json.dumps({"title": title}).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
            r.read()

    await anyio.to_thread.run_sync(post)


def main() -> None:
    import anyio

    plan = json.loads(sys.stdin.read())
    report = anyio.run(_run, plan)
    print(json.dumps(report, default=str), flush=True)


if __name__ == "__main__":
    main()
