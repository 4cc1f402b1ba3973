"""
What an agent that acts through MCP gets when the proxy answers a tool call itself.

The consumer is a model: an MCP client turns an HTTP error (the 409 any other API gets) into
"Server returned an error response", and the model learns nothing. So the proxy answers a tool
call the way a tool reports a failure to a model: HTTP 200, a JSON-RPC `result` with
`isError: true` and a text that says, in plain words, what happened and what to do, with the
call's own JSON-RPC `id` (clients match answers by id) and the framing the client asked for.

    as_tool_answer(answer, call, accept)   # a proxy answer (outcome/tool_answers.py) → the tool call's answer

- A replayed success: the recorded JSON-RPC response with the duplicate's `id` put in, as JSON
  or an event stream (as recorded, when the client accepts it). The session header of the
  first call is never replayed.
- A refused request (Mcp-Method/Mcp-Name disagreeing with the body, a batch, a body read two
  ways: `bad_json`): HTTP 400 with a JSON-RPC error -32600 (invalid request), since it is the
  client's request that is wrong.
- Anything else (a blocked duplicate, a lost answer, a store that could not record): the
  `isError` result. A result the proxy writes for the 2026-07-28 revision carries
  `"resultType": "complete"`, which its clients require.
"""

from __future__ import annotations

import json
from typing import Any

from proxy_addon.outcome.http_answers import Answer
from proxy_addon.wire.jsonpath import NOT_JSON, parse_json
from proxy_addon.wire.jsonrpc import framed, is_sse, messages_of, wants_sse
from proxy_addon.wire.mcp_calls import ToolCall

INVALID_REQUEST = -32600
_STATES = {  # a receipt's state, as the model reads it: "whose outcome is ..."
    "outcome_unknown": "unknown",
    "submitted": "not known yet (it is still in flight)",
    "reconciling": "being checked",
    "manual_review": "waiting for an operator's review",
    "awaiting_approval": "waiting for an operator's approval",
}
_DROPPED = frozenset({"content-type", "content-length", "mcp-session-id", "content-encoding"})
_REFUSALS = ("mcp_call_refused", "method_override_refused", "bad_json")  # the request is wrong: a JSON-RPC error


def as_tool_answer(answer: Answer, call: ToolCall, accept: str | None) -> Answer:
    headers = {k.lower(): v for k, v in answer.headers}
    if headers.get("x-receipt-replayed") == "true":
        return _replayed(answer, call, accept, headers)
    doc = parse_json(answer.body)
    doc = doc if isinstance(doc, dict) and doc is not NOT_JSON else {}
    kept = [(k, v) for k, v in answer.headers if k.lower() not in _DROPPED]
    if answer.status == 400 and doc.get("error") in _REFUSALS:
        message = {"jsonrpc": "2.0", "id": call.id, "error": {"code": INVALID_REQUEST, "message": text_of(doc, call)}}
        return _answer(400, kept, message, sse=wants_sse(accept, False))
    result: dict[str, Any] = {"content": [{"type": "text", "text": text_of(doc, call)}], "isError": True}
    if call.modern:
        result["resultType"] = "complete"
    return _answer(200, kept, {"jsonrpc": "2.0", "id": call.id, "result": result}, sse=wants_sse(accept, False))


def _replayed(answer: Answer, call: ToolCall, accept: str | None, headers: dict[str, str]) -> Answer:
    recorded_sse = is_sse(headers.get("content-type"))
    found = [m for m in messages_of(answer.body, headers.get("content-type")) if "result" in m or "error" in m]
    if not found:  # recorded before the proxy knew it was MCP, or truncated: as recorded
        return answer
    message = {**found[-1], "id": call.id}
    kept = [(k, v) for k, v in answer.headers if k.lower() not in _DROPPED]
    return _answer(answer.status, kept, message, sse=wants_sse(accept, recorded_sse))


def _answer(status: int, headers: list[tuple[str, str]], message: dict[str, Any], *, sse: bool) -> Answer:
    ctype, body = framed(message, sse=sse)
    extra = [("Content-Type", ctype), ("content-length", str(len(body)))]
    if sse:
        extra.insert(1, ("Cache-Control", "no-cache"))
    return Answer(status, (*((k, v) for k, v in headers if k.lower() != "cache-control"), *extra), body)


def text_of(doc: dict[str, Any], call: ToolCall) -> str:
    """The plain words a model reads, from the proxy's own answer (outcome/tool_answers.py)."""
    rid = doc.get("operation_id")
    tool = call.name
    error = doc.get("error")
    hint = doc.get("hint")
    receipt = f" (receipt {rid})" if rid else ""
    if error == "duplicate_unresolved" and doc.get("detail"):
        return (
            f"NOT SENT: this round of the call to {tool}{receipt}: {doc['detail']}. It may or may not have taken "
            "effect: do not repeat it. Tell the user; an operator can settle it with "
            f"`receipts show {rid}` and `receipts reconcile {rid}` (or `receipts resolve`)."
        )
    if error == "duplicate_unresolved" and doc.get("waiting_for") == "input":
        return (
            f"NOT SENT: this call to {tool} duplicates an earlier identical call{receipt} that is waiting for input "
            f"its server asked for (it asked {doc.get('rounds')} time(s)); that call has not completed. It goes on "
            "when its client sends that input (the same call with the server's requestState); do not repeat it, and "
            "do not change its arguments to get around this."
        )
    if error == "duplicate_unresolved" and doc.get("waiting_for") == "task":
        task = doc.get("task_id")
        which = f"task {task}" if task else "a task"
        return (
            f"NOT SENT: this call to {tool} duplicates an earlier identical call{receipt} that the server runs as "
            f"{which}, which has not ended (status {doc.get('task_status') or 'unknown'}). Do not repeat it: poll "
            f"that task (tasks/get{f' {task}' if task else ''}) for its result. When the task ends, an identical call "
            "is answered with its result, or sent again if it provably failed."
        )
    if error == "duplicate_unresolved":
        state = _STATES.get(str(doc.get("state")), "unresolved")
        return (
            f"NOT SENT: this call to {tool} duplicates an earlier identical call{receipt} whose outcome is "
            f"{state}. It may already have taken effect, so sending it again could do it twice. Do not repeat "
            "it, and do not change its arguments to get around this. Tell the user; an operator can settle the "
            f"earlier call with `receipts show {rid}` and `receipts reconcile {rid}` (or `receipts resolve`), "
            "after which an identical call is answered from the record or sent."
            + (f" {hint}." if hint and "retry_after" in doc else "")
        )
    if error == "duplicate_succeeded":
        return f"NOT SENT: an identical earlier call to {tool} already succeeded{receipt}; it was not done again."
    if error == "outcome_unknown":
        return (
            f"The call to {tool} was sent, but its answer was lost{receipt}: it may or may not have taken effect. "
            "Do not call it again to find out: an identical call is blocked until the outcome is settled "
            "(receipt-proxy reads it where the rules say how, or an operator resolves it)."
        )
    if error == "not_sent":
        return f"NOT SENT: the call to {tool} never reached the server{receipt}; it is safe to make it again."
    if error == "budget_exceeded":
        return _over_budget(tool, receipt, doc)
    if error == "denied_by_operator":
        return f"NOT SENT: an operator denied this call to {tool}{receipt}. {doc.get('reason') or ''}".strip()
    if error in _REFUSALS:
        return f"Refused by receipt-proxy, not sent: {doc.get('detail', '')}"
    detail = "; ".join(str(doc[k]) for k in ("error", "detail", "hint") if doc.get(k))
    head = "NOT SENT" if doc.get("sent") is False else "receipt-proxy answered instead of the server"
    return f"{head}: the call to {tool}{receipt}: {detail or json.dumps(doc)[:300]}"


def _over_budget(tool: str, receipt: str, doc: dict) -> str:
    """A call past a budget of its operation (store/budgets.py): not sent, and when it may be tried again."""
    return (
        f"NOT SENT: this call to {tool} is over its budget{receipt}: {doc.get('detail', '')}. Do not retry it "
        f"before {doc.get('retry_after_seconds', '?')} s have passed; tell the user if it cannot wait."
    )
