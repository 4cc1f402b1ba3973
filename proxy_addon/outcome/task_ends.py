"""
A tool call the server runs as a task (outcome/interim_answers.py) ends when its task does. What the task's
answers say, and what a receipt waiting for it becomes.

    asked = task_request(doc)                       # ("tasks/get" | "tasks/result", task id) of a request, or None
    report = get_report(message)                    # a tasks/get answer: the task's status (and its end, 2026-07-28)
    report = result_report(message, last_status)    # a 2025-11-25 tasks/result answer: the call's own answer
    outcome = task_outcome(report, op, revision)    # the receipt's outcome, or None: not ended (or not known yet)

The two revisions:
- 2026-07-28 (the Tasks extension, SEP-2663): `tasks/get` answers the task with its status and,
  once it ended, its end inline: `result` (completed: the tool's result, `isError` true included)
  or `error` (failed: the JSON-RPC error the call ended with). There is no `tasks/result`.
- 2025-11-25: `tasks/get` answers the task's status only; `tasks/result` answers what the call
  would have (its result, or its JSON-RPC error) once it ended. A JSON-RPC error to tasks/result is
  the call's end only when the task was seen `failed` (-32602 is also "no such task").

The rules (docs/rules.md, "Interim answers"): a task's end is judged as the call's answer would have been,
for the specification says tasks/get (tasks/result) answers "exactly what the underlying request
would have returned": a result → succeeded (recorded, so a duplicate is replayed the tool's
result under its own id), `isError` → rejected, a classify rule as for any result; an error
raised before the tool runs (outcome/tool_outcomes.py, BEFORE_THE_TOOL) → rejected, any other error →
outcome_unknown (it may have failed after acting). A `cancelled` task → outcome_unknown: cancellation is
cooperative, the task may have acted before it stopped. A task the server no longer knows
(-32602 to the proxy's own tasks/get: expired, purged), or one the proxy cannot read once its
time to live (its ttl) has passed → outcome_unknown: its end may never be read. A task that has
not ended (working, input_required) leaves the receipt waiting.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from proxy_addon.outcome.classify import Outcome
from proxy_addon.outcome.interim_answers import MODERN
from proxy_addon.outcome.tool_outcomes import tool_outcome
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.store import RecordedResponse

ENDED = frozenset({"completed", "failed", "cancelled"})
STATUSES = frozenset({"working", "input_required", *ENDED})
_ID = 0  # the id of the recorded answer: a replay puts the duplicate's own in its place


@dataclass(frozen=True)
class TaskReport:
    """What one answer says of a task: its status (None: not said), and the call's own answer once it ended."""

    status: str | None
    message: dict[str, Any] | None = None  # {"result": ...} or {"error": ...}: what the call answered in the end
    gone: bool = False  # the server does not know the task (the proxy's own tasks/get: -32602)
    expired: str | None = None  # the proxy's read failed (why) past the task's ttl: its server may have discarded it
    said: str = "tasks/get"


def task_request(doc: Any) -> tuple[str, str] | None:
    """(method, task id) of a `tasks/get` or `tasks/result` request with an id; None for anything else."""
    if not isinstance(doc, dict) or doc.get("method") not in ("tasks/get", "tasks/result") or doc.get("id") is None:
        return None
    params = doc.get("params")
    task_id = params.get("taskId") if isinstance(params, dict) else None
    return (doc["method"], task_id) if isinstance(task_id, str) and task_id else None


def get_report(message: dict[str, Any]) -> TaskReport | None:
    """A tasks/get answer's report; None for an error or an answer that is not a task."""
    result = message.get("result")
    if not isinstance(result, dict) or result.get("status") not in STATUSES:
        return None
    status = result["status"]
    end: dict[str, Any] | None = None
    if status == "completed" and isinstance(result.get("result"), dict):
        end = {"result": result["result"]}
    elif status == "failed" and isinstance(result.get("error"), dict):
        end = {"error": result["error"]}
    return TaskReport(status, end)


def result_report(message: dict[str, Any], last_status: str | None) -> TaskReport | None:
    """
    A 2025-11-25 tasks/result answer: the call's own answer. Its error counts only for a task
    seen `failed` (`last_status`): to a task that is not, it may be "no such task".
    """
    if isinstance(message.get("result"), dict):
        return TaskReport(None, {"result": message["result"]}, said="tasks/result")
    if "error" in message and last_status == "failed":
        error = message["error"] if isinstance(message["error"], dict) else {"message": message["error"]}
        return TaskReport("failed", {"error": error}, said="tasks/result")
    return None


def task_outcome(report: TaskReport, op: Operation, revision: str | None, hint: str) -> Outcome | None:
    """The outcome of the receipt waiting for this task (module docstring); None while it is not known."""
    said = f"task {hint} ({report.said})"
    if report.gone:
        why = f"{said}: the server no longer knows the task (expired or purged): its end cannot be read"
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why)
    if report.expired is not None:
        why = f"{said}: not read ({report.expired}), and past its time to live, after which its server may discard it"
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why)
    if report.status == "cancelled":
        why = f"{said} was cancelled: a task may act before it stops (cancellation is cooperative)"
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why)
    if report.message is None:
        if report.status in ("completed", "failed") and revision == MODERN:  # its end must be inline
            why = f"{said} is {report.status}, without its {'result' if report.status == 'completed' else 'error'}"
            return Outcome(State.OUTCOME_UNKNOWN, why, error=why)
        return None  # not ended; or 2025-11-25: tasks/result tells how it ended
    message = dict(report.message)
    if revision == MODERN and isinstance(message.get("result"), dict):  # a 2026-07-28 client reads resultType
        message["result"] = {"resultType": "complete", **message["result"]}
    body = json.dumps({"jsonrpc": "2.0", "id": _ID, **message}, ensure_ascii=False, separators=(",", ":")).encode()
    recorded = RecordedResponse(200, [("Content-Type", "application/json")], body) if op.record else None
    judged = tool_outcome(200, "OK", {"content-type": "application/json"}, body, op, recorded, _ID)
    if judged.interim is not None:  # a task's end that is itself interim: nothing the proxy can follow
        why = f"{said} ended with a result that is not an outcome ({judged.reason})"
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why)
    ended = "ended with its result" if "result" in message else "failed"
    reason = judged.reason.replace("upstream answered HTTP 200, a tool call's result", f"{said} {ended}", 1)
    if judged.error is not None:
        return dataclasses.replace(judged, reason=reason, error=reason)
    return dataclasses.replace(judged, reason=reason)
