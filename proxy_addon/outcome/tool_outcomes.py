"""
What a tool call's answer means, as a receipt state (the MCP side of outcome/classify.py).

The answer is read for the JSON-RPC response with the call's own `id` (JSON, or an event
stream); in a JSON answer without one, for an error without an id (null or absent): JSON-RPC
answers so when the server could not read the request's id (a parse error, an invalid request),
and a POST carries one request, so that error is the call's (`answer_of`). A result that is not
the call's outcome (`resultType` input_required or task, a 2025-11-25 task handle:
outcome/interim_answers.py) leaves the receipt `submitted`.

A 2xx answer:
- `result` with `isError` false or absent → succeeded;
- `result` with `isError: true` → rejected: the tool reported an error instead of a result
  (unless one of the operation's `classify:` rules says otherwise: a tool whose error may
  come after its effect, "already exists");
- `error` with a code the server raises before it runs the tool (BEFORE_THE_TOOL: -32700,
  -32600 without an id, -32601, -32602, and 2026-07-28's -32020, -32021, -32022) → rejected,
  the reason naming the code and saying what the specification says it means; -32600 under
  the call's id (the official SDK raises it from a running tool), -32603 (internal error), or
  any other code → outcome_unknown: the tool may have run before it failed;
- no response with the call's id in the answer (the stream ended first, it was cut, or the
  body is not JSON-RPC) → outcome_unknown.
Another status is classified as any write's (classify.answer_outcome: a 401 or a 400 refused
the call, a 5xx may have run it), with two readings of a JSON-RPC error in its body where no
`classify:` rule of the operation decides first, on a 4xx that is a refusal by default (not
408 or 409): a code of BEFORE_THE_TOOL is rejected with the specification's words in its
reason (2026-07-28 servers answer these with 400, and 404 for -32601); -32603, and -32600
under the call's id, are outcome_unknown: the server may have failed while running the tool
(the SDK's 2026-07-28 server answers a running tool's -32600 with 400).
docs/rules.md ("MCP: errors raised before the tool runs") has the table, and why each code proves
that the tool did not run.

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

from proxy_addon.outcome.classify import Outcome, answer_outcome, classify_status, rule_fits
from proxy_addon.outcome.interim_answers import interim_of
from proxy_addon.rules import ALREADY_EXISTS, Operation
from proxy_addon.states import State
from proxy_addon.store import RecordedResponse
from proxy_addon.wire.jsonpath import NOT_JSON, id_in, parse_json
from proxy_addon.wire.jsonrpc import is_sse, response_for

INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
# JSON-RPC errors a server raises before it runs the tool: the code → its name, and what the MCP
# specification's schema (2026-07-28) says it means. -32600 only without an id (`_verdict`).
BEFORE_THE_TOOL: dict[int, tuple[str, str]] = {
    -32700: ("Parse error", "invalid JSON was received by the server: it cannot parse the JSON text of the message"),
    INVALID_REQUEST: ("Invalid Request", "the request is not a valid request object"),
    -32601: ("Method not found", "the requested method does not exist or is not available"),
    -32602: (
        "Invalid params",
        "the method parameters are invalid or malformed (a tool: unknown, or invalid arguments)",
    ),
    -32020: (
        "HeaderMismatch",
        "the HTTP headers of the request do not match the corresponding values in its body, or required headers "
        "are missing or malformed",
    ),
    -32021: (
        "MissingRequiredClientCapability",
        "the server requires a client capability that was not declared in the request's clientCapabilities",
    ),
    -32022: ("UnsupportedProtocolVersion", "the request's protocol version is not supported by the server"),
}
INTERNAL = ("Internal error", "an internal error occurred on the receiver")


def answer_of(body: bytes, content_type: str | None, call_id: Any) -> dict[str, Any] | None:
    """
    The JSON-RPC response to the call in an answer: the one with its id; else, in a JSON body, a
    single error without an id (null or absent), which is what a server that could not read the
    id answers (module docstring). None: the answer holds neither.
    """
    found = response_for(body, content_type, call_id)
    if found is not None or is_sse(content_type):
        return found
    doc = parse_json(body)
    if isinstance(doc, dict) and doc is not NOT_JSON and "error" in doc and doc.get("id") is None:
        return doc
    return None


def error_words(code: Any) -> str:
    """`JSON-RPC error -32020 (HeaderMismatch: ...)`: a code, and the specification's words for it when it has some."""
    named = BEFORE_THE_TOOL.get(code) if isinstance(code, int) and not isinstance(code, bool) else None
    if named is None and code == INTERNAL_ERROR:
        named = INTERNAL
    return f"JSON-RPC error {str(code)[:20]}" + (f" ({named[0]}: {named[1]})" if named else "")


def _verdict(message: Mapping[str, Any]) -> tuple[State, str]:
    """
    What a JSON-RPC error answering the call proves: refused before the tool ran (rejected), or
    nothing (outcome_unknown), and why. -32600 proves it only without an id: a server that read
    the call's id could have dispatched it, and the official SDK (mcp 2.x) raises -32600 under
    the call's id from a running tool (NoBackChannelError: the tool asked the client for input
    on a transport that cannot carry the request), after the tool may have written.
    """
    error = message.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    known = isinstance(code, int) and not isinstance(code, bool) and code in BEFORE_THE_TOOL
    if known and not (code == INVALID_REQUEST and message.get("id") is not None):
        return State.REJECTED, f"{error_words(code)}: the server refused the call before running the tool"
    if known:
        return State.OUTCOME_UNKNOWN, (
            f"{error_words(code)} under the call's id: a server that read the call may raise it from the running "
            "tool (the official SDK does, when the tool asks the client for input it cannot send): the tool may "
            "have run before it failed"
        )
    return State.OUTCOME_UNKNOWN, f"{error_words(code)}: the tool may have run before it failed"


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
    handle: outcome/interim_answers.py) is no outcome: its Outcome stays `submitted`, with `interim` set.
    """
    if not 200 <= status < 300:
        return _http_error_outcome(status, phrase, headers, body, op, recorded, call_id)
    message = answer_of(body, headers.get("content-type"), call_id)
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
        state, why = _verdict(message)
        return _outcome(state, why, status, view, op, recorded)
    if view["isError"]:
        return _outcome(
            State.REJECTED, "the tool answered isError: true (a tool error, no result)", status, view, op, recorded
        )
    return _outcome(State.SUCCEEDED, None, status, view, op, recorded)


def _http_error_outcome(
    status: int,
    phrase: str,
    headers: Mapping[str, str],
    body: bytes,
    op: Operation,
    recorded: RecordedResponse | None,
    call_id: Any,
) -> Outcome:
    """
    An answer that is not 2xx: as any write's (classify.answer_outcome), but where no `classify:`
    rule or status of the operation decides and the body holds the call's JSON-RPC error, a 4xx
    whose default is a refusal says which (`_verdict`: rejected, in the specification's words), or
    that the server may have failed while processing it (-32603, and -32600 under the call's id,
    which the SDK's 2026-07-28 server answers with 400: outcome_unknown). A 5xx stays
    outcome_unknown, its reason naming the code.
    """
    outcome = answer_outcome(status, phrase, headers, body, op, recorded)
    message = answer_of(body, headers.get("content-type"), call_id)
    error = message.get("error") if message is not None else None
    if message is None or not isinstance(error, dict) or _decided_by_rules(status, headers, body, op):
        return outcome
    if status >= 500:  # the status says it may have run, whatever the code: the code is said too
        why = f"{error_words(error.get('code'))}: the tool may have run before it failed"
        return dataclasses.replace(outcome, reason=f"{outcome.reason}: {why}", error=f"{outcome.error}: {why}")
    if classify_status(status) is not State.REJECTED:  # 408, 409: as any write's
        return outcome
    state, why = _verdict(message)
    if state is State.REJECTED:
        return dataclasses.replace(outcome, reason=f"{outcome.reason}: {why}", error=f"{outcome.error}: {why}")
    if error.get("code") in (INTERNAL_ERROR, INVALID_REQUEST):  # it says the server failed while processing the call
        why = f"upstream answered HTTP {status}: {why}"
        return Outcome(State.OUTCOME_UNKNOWN, why, error=why, http_status=status, response=recorded)
    return outcome


def _decided_by_rules(status: int, headers: Mapping[str, str], body: bytes, op: Operation) -> bool:
    """Whether one of the operation's classify rules, or its status map, fits the answer (the operation decides)."""
    code, klass = str(status), f"{status // 100}xx"
    return any(key in (code, klass) for key, _ in op.classify) or any(
        rule_fits(rule, status, headers, body) for rule in op.classify_rules
    )


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
