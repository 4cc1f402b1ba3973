"""
A tool call's result that is not its outcome, read from its `resultType` (2026-07-28: every result
carries one; absent, as in 2025-11-25, means "complete").

    outcome = interim_of(message, task_call=call.task)   # None: a complete result (tool_outcomes.py classifies it)

- `"input_required"` (multi-round-trip requests): the server asks the client for input (an
  elicitation, a sampling, the roots) before it goes on. Not an outcome: the receipt stays
  `submitted`, waiting for the client's next round (store/rounds.py). The answer passes to the
  client untouched and is never replayed.
- `"task"` (the Tasks extension, SEP-2663), or `{"task": {...}}` answering a 2025-11-25
  task-augmented call (`params.task`): the server runs the call as a task. Not an outcome either:
  the receipt stays `submitted`, with the task's id (sealed) and status; the task's end decides
  it (outcome/task_ends.py).
- Another `resultType` (an extension's result the proxy does not know), a task handle without a
  usable task id: what happened cannot be told → outcome_unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy_addon.outcome.classify import Outcome
from proxy_addon.states import State
from proxy_addon.store import Interim
from proxy_addon.wire.terminal import escape_controls

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
MAX_TASK_ID = 1024  # characters: a longer task id is not followed (outcome_unknown)
_SHOWN = 5  # input requests named in a reason


def interim_of(message: Mapping[str, Any], *, task_call: bool = False) -> Outcome | None:
    """The interim answer (or the unknown one) a JSON-RPC response to a tool call is; None for a complete result."""
    result = message.get("result")
    if not isinstance(result, dict):
        return None
    kind = result.get("resultType")
    if kind in (None, "complete"):
        if task_call and isinstance(result.get("task"), dict):  # 2025-11-25's CreateTaskResult
            return _task(result["task"], LEGACY)
        return None
    if kind == "input_required":
        return Outcome(State.SUBMITTED, _asked(result), interim=Interim("input_required", _asked(result)))
    if kind == "task":
        return _task(result, MODERN)
    why = (
        f"the tool call's result is of type {_short(kind)}, which receipt-proxy does not know (an extension's): "
        "whether it is an outcome cannot be told, and the tool may have run"
    )
    return Outcome(State.OUTCOME_UNKNOWN, why, error=why)


def _task(task: Mapping[str, Any], revision: str) -> Outcome:
    task_id, status = task.get("taskId"), task.get("status")
    if not isinstance(task_id, str) or not task_id or len(task_id) > MAX_TASK_ID:
        why = (
            "the server answered with a task handle whose taskId cannot be followed (not a string, empty or longer "
            f"than {MAX_TASK_ID} characters): the task may run, and its end cannot be read"
        )
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why)
    shown = status if isinstance(status, str) else "unknown"
    ttl = task.get("ttlMs" if revision == MODERN else "ttl")
    seconds = ttl / 1000 if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else None
    why = (
        f"the server runs the call as a task ({revision}, status {_short(shown)}): not an outcome; the task's end "
        "decides it"
    )
    return Outcome(
        State.SUBMITTED,
        why,
        interim=Interim("task", why, task_id=task_id, task_status=shown[:40], task_revision=revision, task_ttl=seconds),
    )


def _asked(result: Mapping[str, Any]) -> str:
    requests = result.get("inputRequests")
    methods = [r.get("method") for r in requests.values() if isinstance(r, dict)] if isinstance(requests, dict) else []
    named = ", ".join(_short(m) for m in methods[:_SHOWN]) + (", …" if len(methods) > _SHOWN else "")
    what = f" ({named})" if named else ""
    return (
        f"the server asked for input{what} (input_required): not an outcome; the call goes on when the client "
        "sends it, under this receipt"
    )


def _short(value: Any) -> str:
    text = escape_controls(" ".join(str(value).split()))
    return text if len(text) <= 40 else text[:37] + "..."
