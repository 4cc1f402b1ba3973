"""
Tasks for the MCP test server and client (tests/e2e/mcp/server.py, tests/e2e/mcp/client.py), on the official
SDK's extension interfaces: the SDK (mcp 2.3.0) ships the task types but no task runtime.

Two revisions, as the specification has them:
- 2026-07-28, the Tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`): a client that declares
  the extension in a request's `_meta` clientCapabilities may get, for a `tools/call`, a
  `CreateTaskResult` (`"resultType": "task"`, the Task's fields inline) instead of the tool's result.
  It polls `tasks/get` (`Mcp-Name: <taskId>`), whose result is the DetailedTask: a `completed` one
  carries the tool's result in `result`, a `failed` one the JSON-RPC error in `error`. There is no
  `tasks/result`. Server side: `TasksExtension`, an SDK `Extension` (intercept_tool_call, and the
  methods tasks/get and tasks/cancel); client side: `TasksClient`, an SDK `ClientExtension` whose
  ResultClaim on `resultType: task` polls tasks/get to the end (`Client.call_tool` returns the tool's
  result, or raises MCPError for a failed task).
- 2025-11-25 (experimental tasks in the core protocol): a `tools/call` with `params.task` (`{"ttl"}`)
  is task-augmented; the server answers `{"task": {...}}` (CreateTaskResult, no resultType); the client
  polls `tasks/get` (the Task, without the result), then `tasks/result`, which answers what the call
  would have (the tool's result, or its JSON-RPC error). The SDK's runner validates a legacy tools/call
  result as a CallToolResult, so the CreateTaskResult comes from a server middleware (`legacy_tasks`)
  that answers before validation; tasks/get and tasks/result are the extension's methods there too.

Which tool runs as a task: `TASK_TOOL` (create_issue_later), when the request asks for one (2025) or
declares the extension (2026); otherwise it runs at once, as any tool. The task records an issue after
`delay` seconds and completes with it, unless the call's fault (queued with POST /_faults, or its
`fault` argument) says otherwise:
    task_fails      records the issue, then fails with JSON-RPC -32603 (the effect exists)
    task_invalid    records nothing; fails with JSON-RPC -32602 (invalid params)
    task_cancelled  records the issue, then ends `cancelled`
    task_hold       stays `working` until POST /_release (then completes as usual)
Tasks are kept in memory, at most MAX_TASKS (the oldest finished ones are forgotten first).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any, Literal

from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field

EXTENSION = "io.modelcontextprotocol/tasks"
CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
RELATED_TASK = "io.modelcontextprotocol/related-task"
TASK_TOOL = "create_issue_later"
TASK_FAULTS = ("task_fails", "task_invalid", "task_cancelled", "task_hold")
LEGACY = "2025-11-25"
MAX_TASKS = 1000
TERMINAL = ("completed", "failed", "cancelled")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TaskRuntime:
    """The server's tasks: started by a tool call, run in the background, read by tasks/get."""

    def __init__(self, record_issue: Callable[[str, str], dict[str, Any]], delay: float = 0.3):
        self.record_issue = record_issue
        self.delay = delay
        self.tasks: dict[str, dict[str, Any]] = {}
        self.held = asyncio.Event()  # set by POST /_release: held tasks go on
        self._running: set[asyncio.Task] = set()

    def start(self, arguments: dict[str, Any], fault: str, ttl: int | None) -> dict[str, Any]:
        task_id = str(uuid.uuid4())
        now = _now()
        task = {
            "taskId": task_id,
            "status": "working",
            "createdAt": now,
            "lastUpdatedAt": now,
            "ttl": ttl,
            "pollInterval": 50,
            "done": asyncio.Event(),
        }
        self._forget_old()
        self.tasks[task_id] = task
        runner = asyncio.get_running_loop().create_task(self._run(task, arguments, fault))
        self._running.add(runner)
        runner.add_done_callback(self._running.discard)
        return task

    def release(self) -> None:
        self.held.set()

    def reset(self) -> None:
        self.tasks.clear()
        self.held = asyncio.Event()

    def _forget_old(self) -> None:
        while len(self.tasks) >= MAX_TASKS:
            done = next((k for k, t in self.tasks.items() if t["status"] in TERMINAL), next(iter(self.tasks)))
            del self.tasks[done]

    async def _run(self, task: dict[str, Any], arguments: dict[str, Any], fault: str) -> None:
        await asyncio.sleep(self.delay)
        if fault == "task_hold":
            await self.held.wait()
        title, body = str(arguments.get("title", "")), str(arguments.get("body", ""))
        if fault == "task_invalid":
            self._end(task, "failed", error={"code": -32602, "message": "invalid params: refused (fault task_invalid)"})
            return
        issue = self.record_issue(title, body)
        if fault == "task_fails":
            self._end(task, "failed", error={"code": -32603, "message": "internal error after commit (task_fails)"})
        elif fault == "task_cancelled":
            self._end(task, "cancelled", message="cancelled after it started (fault task_cancelled)")
        else:
            text = f'{{"number": {issue["number"]}, "title": {title!r}}}'.replace("'", '"')
            self._end(
                task,
                "completed",
                result={"content": [{"type": "text", "text": text}], "structuredContent": issue, "isError": False},
            )

    @staticmethod
    def _end(
        task: dict[str, Any],
        status: str,
        *,
        result: dict | None = None,
        error: dict | None = None,
        message: str | None = None,
    ) -> None:
        task.update(status=status, lastUpdatedAt=_now())
        if result is not None:
            task["result"] = result
        if error is not None:
            task["error"] = error
            task["statusMessage"] = error["message"]
        if message is not None:
            task["statusMessage"] = message
        task["done"].set()

    def find(self, task_id: str) -> dict[str, Any]:
        task = self.tasks.get(task_id)
        if task is None:
            raise MCPError(-32602, "Failed to retrieve task: Task not found")
        return task

    # --- the wire shapes -------------------------------------------------------------------

    @staticmethod
    def created(task: dict[str, Any], *, legacy: bool) -> dict[str, Any]:
        """The CreateTaskResult of a tool call."""
        if legacy:
            return {"task": TaskRuntime.legacy_task(task)}
        return {"resultType": "task", **TaskRuntime.modern_task(task, detailed=False)}

    @staticmethod
    def modern_task(task: dict[str, Any], *, detailed: bool) -> dict[str, Any]:
        """SEP-2663's Task (ttlMs, pollIntervalMs), with `result`/`error` inline when `detailed` (tasks/get)."""
        out = {
            "taskId": task["taskId"],
            "status": task["status"],
            "createdAt": task["createdAt"],
            "lastUpdatedAt": task["lastUpdatedAt"],
            "ttlMs": task["ttl"],
            "pollIntervalMs": task["pollInterval"],
        }
        if "statusMessage" in task:
            out["statusMessage"] = task["statusMessage"]
        if detailed:
            out.update({k: task[k] for k in ("result", "error") if k in task})
        return out

    @staticmethod
    def legacy_task(task: dict[str, Any]) -> dict[str, Any]:
        """2025-11-25's Task (ttl, pollInterval): never the result (that is tasks/result's)."""
        out = {
            "taskId": task["taskId"],
            "status": task["status"],
            "createdAt": task["createdAt"],
            "lastUpdatedAt": task["lastUpdatedAt"],
            "ttl": task["ttl"],
            "pollInterval": task["pollInterval"],
        }
        if "statusMessage" in task:
            out["statusMessage"] = task["statusMessage"]
        return out


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


def _declares_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    meta = (ctx.params or {}).get("_meta") if isinstance(ctx.params, dict) else None
    caps = meta.get(CAPABILITIES_META) if isinstance(meta, dict) else None
    extensions = caps.get("extensions") if isinstance(caps, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


class TasksExtension(Extension):
    """SEP-2663 on the SDK's server `Extension`: TASK_TOOL runs as a task for a client that declares it."""

    identifier = EXTENSION

    def __init__(self, runtime: TaskRuntime, fault_of: Callable[[dict[str, Any]], str]):
        self.runtime = runtime
        self.fault_of = fault_of

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self._get),
            MethodBinding("tasks/result", TaskIdParams, self._result, protocol_versions=frozenset({LEGACY})),
            MethodBinding("tasks/cancel", TaskIdParams, self._cancel),
        ]

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if params.name != TASK_TOOL or ctx.protocol_version == LEGACY or not _declares_extension(ctx):
            return await call_next(ctx)
        arguments = dict(params.arguments or {})
        task = self.runtime.start(arguments, self.fault_of(arguments), ttl=600_000)
        return self.runtime.created(task, legacy=False)

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        task = self.runtime.find(params.task_id)
        if ctx.protocol_version == LEGACY:
            return TaskRuntime.legacy_task(task)
        return {"resultType": "complete", **TaskRuntime.modern_task(task, detailed=True)}

    async def _result(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        """2025-11-25: what the call would have answered, once the task has ended (waits up to 30 s)."""
        task = self.runtime.find(params.task_id)
        await asyncio.wait_for(task["done"].wait(), 30)
        if "error" in task:
            raise MCPError(task["error"]["code"], task["error"]["message"])
        if task["status"] == "cancelled":
            raise MCPError(-32603, "the task was cancelled")
        return {**task["result"], "_meta": {RELATED_TASK: {"taskId": task["taskId"]}}}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        task = self.runtime.find(params.task_id)
        if task["status"] not in TERMINAL:
            TaskRuntime._end(task, "cancelled", message="cancelled by request")
        return {} if ctx.protocol_version != LEGACY else TaskRuntime.legacy_task(task)


def legacy_tasks(runtime: TaskRuntime, fault_of: Callable[[dict[str, Any]], str]):
    """
    A server middleware for 2025-11-25's task-augmented tools/call of TASK_TOOL: it answers the
    CreateTaskResult itself, before the runner validates the result as a CallToolResult.
    """

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params if isinstance(ctx.params, dict) else {}
        if (
            ctx.method != "tools/call"
            or ctx.protocol_version != LEGACY
            or params.get("name") != TASK_TOOL
            or not isinstance(params.get("task"), dict)
        ):
            return await call_next(ctx)
        arguments = dict(params.get("arguments") or {})
        ttl = params["task"].get("ttl")
        task = runtime.start(arguments, fault_of(arguments), ttl=ttl if isinstance(ttl, int) else 600_000)
        return runtime.created(task, legacy=True)

    return middleware


# --- the client side ------------------------------------------------------------------------


class CreatedTask(Result):
    """SEP-2663's CreateTaskResult, as the client's claim parses it."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field("task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # SEP-2663: Mcp-Name carries the task id


class TaskResultRequest(Request[TaskIdParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: TaskIdParams


class AnyResult(Result):
    model_config = ConfigDict(extra="allow")


class TasksClient(ClientExtension):
    """SEP-2663 on the SDK's `ClientExtension`: a CreateTaskResult is polled with tasks/get to its end."""

    identifier = EXTENSION

    def __init__(self, polls: int = 400) -> None:
        self.polls = polls
        self.seen: list[str] = []  # task ids handed to this client, in order

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._resolve)]

    async def _resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        self.seen.append(created.task_id)
        return await poll_task(ctx.session, created.task_id, legacy=False, polls=self.polls)


async def poll_task(session: Any, task_id: str, *, legacy: bool, polls: int = 400) -> CallToolResult:
    """Poll tasks/get until the task ends (then, in 2025-11-25, tasks/result); its CallToolResult, or MCPError."""
    for _ in range(polls):
        got = await session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), AnyResult)
        doc = got.model_dump(by_alias=True, mode="json")
        if doc.get("status") in TERMINAL:
            break
        await asyncio.sleep(0.05)
    else:
        raise TimeoutError(f"task {task_id} did not end")
    if legacy:
        final = await session.send_request(TaskResultRequest(params=TaskIdParams(taskId=task_id)), AnyResult)
        return CallToolResult.model_validate(final.model_dump(by_alias=True, mode="json"))
    if doc["status"] == "completed":
        return CallToolResult.model_validate(doc["result"])
    error = doc.get("error") or {"code": -32603, "message": f"the task ended {doc['status']}"}
    raise MCPError(error["code"], error["message"])
