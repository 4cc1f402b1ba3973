"""
A forwarded write's answer, between the exchange and the record: the key the proxy adds
before sending, what an answer means (read up to receipts_response_cap, else from its status
and headers), and what the agent gets of an answer past that cap.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from mitmproxy import http

from proxy_addon.errors import BadEncoding, BodyTooLarge
from proxy_addon.intent import identity
from proxy_addon.mitm import flows
from proxy_addon.mitm.exchange import Rest
from proxy_addon.mitm.flows import headers_of
from proxy_addon.outcome import http_answers as answers
from proxy_addon.outcome.classify import Outcome, answer_outcome, head_outcome
from proxy_addon.outcome.tool_outcomes import tool_outcome
from proxy_addon.rules import Operation
from proxy_addon.states import State
from proxy_addon.store import Receipt, RecordedResponse
from proxy_addon.wire.bodies import codings, decode_body

logger = logging.getLogger(__name__)


def add_key(flow: http.HTTPFlow, op: Operation, receipt: Receipt, given_key: str | None, body: bytes) -> None:
    """
    Put the receipt's idempotency key where the API reads it, in place of any key the agent
    sent: the key that goes upstream is always the one the receipt records, so that a retry
    is sent with the key its first attempt went with (store/attempts.py `continues`).
    - a header (`idempotency_key.header`): the receipt's key, always the proxy's own; the
      agent's header is replaced (it identifies the agent's request to the proxy only, as a
      keyed hash: client_key, never stored or sent);
    - a body id (`idempotency_key.body`): the agent's own id (`given_key`) is the receipt's key
      on a new attempt and is left as sent; a retry's remembered id replaces another one.
    """
    key = receipt.idempotency_key
    if not key:
        return
    header = op.idempotency_header
    if header and flow.request.headers.get_all(header) != [key]:
        flow.request.headers[header] = key  # one field, whatever the agent sent (none, another, several)
    if op.idempotency_body and given_key != key:
        keyed = identity.with_body_key(op, body, key)  # `body` decoded: re-encoded here
        if keyed is not None:
            flow.request.content = keyed
        elif given_key is not None:  # the agent's id is not the receipt's, and stays: never sent so
            raise RuntimeError(
                f"{op.api} {op.name}: the receipt's {op.idempotency_body} could not replace the agent's own here"
            )


def outcome_of(
    resp: http.Response,
    op: Operation | None,
    *,
    cap: int,
    complete: bool = True,
    call_id: Any = None,
    task_call: bool = False,
) -> Outcome:
    """
    What an answer means. Its body, decoded, is read up to `cap`; past that (or when `complete`
    is False: only its first bytes are there) the outcome comes from the status and headers,
    and the recorded answer is truncated. `call_id`: an MCP tool call's JSON-RPC id (outcome/tool_outcomes.py);
    `task_call`: a 2025-11-25 task-augmented one.
    No answer is recorded for an operation whose rule says `record: false`.
    """
    raw = resp.raw_content or b""
    body: bytes | None = None
    if complete:
        try:
            body = decode_body(raw, resp.headers.get("content-encoding"), limit=cap)
        except BodyTooLarge:
            body = None
        except BadEncoding:
            body = raw  # as sent: what the agent gets too
    status, items, headers = resp.status_code, resp.headers.items(multi=True), headers_of(resp)
    keep = op is None or op.record
    recorded: RecordedResponse | None
    if body is not None:
        recorded = answers.recorded(status, items, body, cap) if keep else None
        if op is not None and op.mcp_tool is not None and call_id is not None:
            return tool_outcome(status, resp.reason, headers, body, op, recorded, call_id, task_call=task_call)
        outcome = answer_outcome(status, resp.reason, headers, body, op, recorded)
    else:
        kept = b"" if codings(resp.headers.get("content-encoding")) else raw[:cap]
        recorded = dataclasses.replace(answers.recorded(status, items, kept, cap), truncated=True) if keep else None
        why = f"its body is larger than receipts_response_cap, {cap} bytes"
        if op is not None and op.mcp_tool is not None and 200 <= status < 300:  # the tool's result is in the body
            why = f"outcome unknown: a tool call's answer (HTTP {status}) was not read: {why}"
            return Outcome(State.OUTCOME_UNKNOWN, why, error=why, http_status=status, response=recorded)
        outcome = head_outcome(status, resp.reason, headers, op, recorded, why)
    return outcome


def pass_rest(flow: http.HTTPFlow, meta: dict, rest: Rest, *, limit: int, timeout: float) -> None:
    """Give the agent the rest of an answer past the record cap, or say why it is not passed."""
    resp = flow.response
    assert resp is not None
    if rest.body is not None:
        resp.raw_content = rest.body
        resp.headers["content-length"] = str(len(rest.body))
        return
    if rest.why == "agent_left":
        logger.warning(
            f"receipt {meta['operation_id']}: the agent left; stopped reading the answer after "
            f"{rest.received} bytes and closed the upstream connection (recorded as {meta['state']})"
        )
    else:
        logger.warning(
            f"receipt {meta['operation_id']}: the answer (HTTP {resp.status_code}) was not passed to the agent: "
            f"{rest.why} after {rest.received} bytes{f' ({rest.detail})' if rest.detail else ''}; "
            f"recorded as {meta['state']} from its status"
        )
    flows.answer(
        flow,
        answers.response_not_passed(
            meta["operation_id"],
            State(meta["state"]),
            resp.status_code,
            rest.why,
            received=rest.received,
            limit=limit,
            timeout=timeout,
            detail=rest.detail,
        ),
    )
