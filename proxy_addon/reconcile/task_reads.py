"""
The proxy's own read of a task (outcome/task_ends.py): when a duplicate of a write whose server runs it as
a task arrives, the proxy asks the server how the task is, with the duplicate's own credentials,
in the revision the task was created in. It is a read (tasks/get, tasks/result), never a write.

    report = await read_task(client, url, task_id, "2026-07-28", credentials)   # TaskReport

- 2026-07-28 (the Tasks extension): one `tasks/get`, with no session: `MCP-Protocol-Version`,
  `Mcp-Method: tasks/get`, `Mcp-Name: <task id>` (SEP-2663: routing to the task's server), and the
  request `_meta` the revision requires (protocolVersion, clientInfo, and clientCapabilities that
  declare the extension, without which a server answers -32021).
- 2025-11-25: a session of its own (`initialize`, `notifications/initialized`; the agent's is
  never used: tasks are bound to the caller's authorization, not to a session), `tasks/get`, then,
  for a task that ended completed or failed, `tasks/result` (which answers at once then), and the
  session's end (DELETE).

ReconcileError when the read fails (an HTTP error, a status other than 2xx, no answer with the
request's id): it proves nothing, and the receipt waits on. A -32602 to tasks/get is the server
saying it does not know the task (`TaskReport.gone`).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from proxy_addon.errors import ReconcileError
from proxy_addon.outcome.interim_answers import MODERN
from proxy_addon.outcome.task_ends import TaskReport, get_report, result_report
from proxy_addon.wire.jsonrpc import response_for

LEGACY = "2025-11-25"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
ACCEPT = "application/json, text/event-stream"
CLIENT = {"name": "receipt-proxy-task-read", "version": "1"}
INVALID_PARAMS = -32602


async def read_task(
    client: httpx.AsyncClient, url: str, task_id: str, revision: str | None, credentials: Mapping[str, str]
) -> TaskReport:
    try:
        if revision == MODERN:
            return await _read_modern(client, url, task_id, credentials)
        return await _read_legacy(client, url, task_id, credentials)
    except httpx.HTTPError as e:
        raise ReconcileError(f"the task could not be read: {type(e).__name__}") from None


async def _read_modern(client: httpx.AsyncClient, url: str, task_id: str, credentials: Mapping[str, str]) -> TaskReport:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": CLIENT,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
    }
    headers = {
        "mcp-protocol-version": MODERN,
        "mcp-method": "tasks/get",
        "mcp-name": _header_value(task_id),
        **credentials,
    }
    message = await _ask(client, url, headers, "tasks/get", {"taskId": task_id, "_meta": meta})
    return _report(message)


async def _read_legacy(client: httpx.AsyncClient, url: str, task_id: str, credentials: Mapping[str, str]) -> TaskReport:
    headers = dict(credentials)
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": CLIENT}
    r = await _post(client, url, headers, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
    if "error" in _found(r, 1, "initialize"):
        raise ReconcileError("MCP initialize answered a JSON-RPC error")
    if session := r.headers.get("mcp-session-id"):
        headers["mcp-session-id"] = session
    headers["mcp-protocol-version"] = LEGACY
    try:
        await _post(client, url, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        report = _report(await _ask(client, url, headers, "tasks/get", {"taskId": task_id}, rid=2))
        if report.status in ("completed", "failed"):
            answer = await _ask(client, url, headers, "tasks/result", {"taskId": task_id}, rid=3)
            ended = result_report(answer, report.status)
            if ended is not None:
                return TaskReport(report.status, ended.message, said="tasks/get, tasks/result")
        return report
    finally:
        if "mcp-session-id" in headers:
            with contextlib.suppress(httpx.HTTPError):  # the server ends idle sessions itself
                await client.delete(url, headers=headers)


def _report(message: dict[str, Any]) -> TaskReport:
    error = message.get("error")
    if isinstance(error, dict) and error.get("code") == INVALID_PARAMS:
        return TaskReport(None, gone=True, said="the proxy's tasks/get")
    if "error" in message:
        code = error.get("code") if isinstance(error, dict) else None
        raise ReconcileError(f"tasks/get answered JSON-RPC error {str(code)[:20]}")
    report = get_report(message)
    if report is None:
        raise ReconcileError("tasks/get answered no task")
    return TaskReport(report.status, report.message, said="the proxy's tasks/get")


async def _ask(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], method: str, params: dict[str, Any], rid: int = 1
) -> dict[str, Any]:
    r = await _post(client, url, headers, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    return _found(r, rid, method)


def _found(r: httpx.Response, rid: int, method: str) -> dict[str, Any]:
    found = response_for(r.content, r.headers.get("content-type"), rid)
    if found is None:
        raise ReconcileError(f"MCP {method} answered HTTP {r.status_code} without a JSON-RPC response")
    if r.status_code // 100 != 2 and "error" not in found:
        raise ReconcileError(f"MCP {method} answered HTTP {r.status_code}")
    return found


async def _post(client: httpx.AsyncClient, url: str, headers: Mapping[str, str], message: dict) -> httpx.Response:
    sent = {"accept": ACCEPT, "content-type": "application/json", **headers}
    return await client.post(url, headers=sent, content=json.dumps(message).encode())


def _header_value(value: str) -> str:
    """A header value as SEP-2243 sends one: as it is when it is plain printable ASCII, else `=?base64?…?=`."""
    if value.isascii() and value.isprintable() and value == value.strip() and not value.startswith("=?"):
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode("ascii") + "?="
