"""
What a tool call's answer means, as a receipt state (the MCP side of classify.py).

An answer other than 2xx is classified as any write's (classify.answer_outcome): a 401 or a
400 refused the call, a 5xx may have run it. A 2xx answer, JSON or an event stream, is read
for the JSON-RPC response with the call's own `id`; a result that is not the call's outcome
(`resultType` input_required or task, a 2025-11-25 task handle: mcp/interim.py) leaves the receipt
`submitted`; otherwise:
- `result` with `isError` false or absent → succeeded;
- `result` with `isError: true` → rejected: the tool reported an error instead of a result
  (unless one of the operation's `classify:` rules says otherwise: a tool whose error may
  come after its effect, "already exists");
- `error` -32602 (invalid params): the server refused the call before running the tool →
  rejected; -32603 (internal error), or any other code → outcome_unknown: the tool may have
  run before it failed;
- no response with the call's id in the answer (the stream ended first, it was cut, or the
  body is not JSON-RPC) → outcome_unknown.

What the `classify:` rules of an MCP operation test (`body:` paths), and what `external_id`
and reconcile reads read (`document`):

    isError      true or false (a result)
    text         the text content, its parts joined with a newline
    document     the result's structuredContent, else its text content parsed as JSON
    error.code   a JSON-RPC error's code; error.message, error.data

The tool's texts never enter a receipt's reason: the recorded answer keeps them, as any
API's body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from proxy_addon.classify import Outcome, answer_outcome, rule_fits
from proxy_addon.jsonpath import NOT_JSON, id_in, parse_json
from proxy_addon.mcp.interim import interim_of
from proxy_addon.mcp.jsonrpc import response_for
from proxy_addon.rules import ALREADY_EXISTS, Operation
from proxy_addon.states import State
from proxy_addon.store import RecordedResponse

INVALID_PARAMS = -32602


def result_view(message: Mapping[str, Any]) -> dict[str, Any]:
    """What classify rules and reads see of a JSON-RPC response (module docstring)."""
    if "error" in message:
        error = message["error"]
        return {"error": error if isinstance(error, dict) else {"message": error}}
    result = message.get("result")
    result = result if isinstance(result, dict) else {}
    content = result.get("content")
    texts = (
        [c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)]
        if isinstance(content, list)
        else []
    )
    text = "\n".join(texts)
    document = result.get("structuredContent")
    if document is None and texts:
        parsed = parse_json(text)
        document = None if parsed is NOT_JSON else parsed
    return {
        "isError": result.get("isError") is True,
        "text": text,
        "document": document,
        "content": content,
        "structuredContent": result.get("structuredContent"),
    }


def tool_outcome(
    status: int,
    phrase: str,
    headers: Mapping[str, str],
    body: bytes,
    op: Operation,
    recorded: RecordedResponse | None,
    call_id: Any,
    *,
    task_call: bool = False,
) -> Outcome:
    """
    The outcome of an answer to a tool call (`headers` with lower-case names, `body` decoded);
    `task_call`: a 2025-11-25 task-augmented call. An interim answer (input_required, a task
    handle: mcp/interim.py) is no outcome: its Outcome stays `submitted`, with `interim` set.
    """
    if not 200 <= status < 300:
        return answer_outcome(status, phrase, headers, body, op, recorded)
    message = response_for(body, headers.get("content-type"), call_id)
    if message is None:
        why = (
            f"upstream answered HTTP {status} without a JSON-RPC response to the call (id {str(call_id)[:40]}): "
            "the tool may have run"
        )
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why, http_status=status, response=recorded)
    if (interim := interim_of(message, task_call=task_call)) is not None:
        if interim.interim is not None:
            return interim  # never recorded: an interim answer is never replayed
        return dataclasses.replace(interim, http_status=status, response=recorded)
    view = result_view(message)
    for rule in op.classify_rules:
        if rule_fits(dataclasses.replace(rule, statuses=()), status, headers, b"", [view]):
            return _outcome(
                State(rule.state) if rule.state != ALREADY_EXISTS else None, rule.reason, status, view, op, recorded
            )
    if "error" in view:
        code = view["error"].get("code")
        if code == INVALID_PARAMS:
            return _outcome(
                State.REJECTED,
                "JSON-RPC error -32602 (invalid params): the server refused the call before running the tool",
                status,
                view,
                op,
                recorded,
            )
        return _outcome(
            State.OUTCOME_UNKNOWN,
            f"JSON-RPC error {str(code)[:20]}: the tool may have run before it failed",
            status,
            view,
            op,
            recorded,
        )
    if view["isError"]:
        return _outcome(
            State.REJECTED, "the tool answered isError: true (a tool error, no result)", status, view, op, recorded
        )
    return _outcome(State.SUCCEEDED, None, status, view, op, recorded)


def _outcome(
    state: State | None,
    why: str | None,
    status: int,
    view: dict[str, Any],
    op: Operation,
    recorded: RecordedResponse | None,
) -> Outcome:
    """`state` None: the answer says the effect may already exist (a classify rule's already_exists): a read decides."""
    exists = state is None
    final = State.OUTCOME_UNKNOWN if exists else state
    assert final is not None
    reason = f"upstream answered HTTP {status}, a tool call's result" + (f": {why}" if why else "")
    if exists:
        reason += " (evidence that the effect may already exist: a read decides)"
    external = None
    if final is State.SUCCEEDED and op.external_id and isinstance(view.get("document"), (dict, list)):
        external = id_in(view["document"], op.external_id)
    return Outcome(
        final,
        reason,
        error=None if final is State.SUCCEEDED else reason,
        http_status=status,
        response=recorded,
        evidence=exists,
        external_id=external,
    )
