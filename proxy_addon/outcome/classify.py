"""
What happened to a forwarded request, as a receipt state: every mapping from an answer or a
transport failure to a state lives here.

    outcome = answer_outcome(status, reason, headers, body, op)    # the upstream answered
    outcome = head_outcome(status, reason, headers, op, rec, why)  # ...with a body too large to read first
    outcome = failure_outcome(exc)                                 # our own exchange failed (httpx)
    outcome = error_outcome(message, tcp_setup=..., ...)           # mitmproxy's forwarding failed

Responses: 2xx and 3xx → succeeded; 408 → outcome_unknown; 409 → already_exists (a conflict
may be with this very effect, made by an earlier attempt or one still running: a read decides,
or manual review); other 4xx → rejected (refused before executing: validation, auth, rate
limits); 5xx → outcome_unknown. Only `rejected` renews an idempotency key, so the defaults err
toward "maybe executed"; docs/rules.md has the table. An operation's `classify:` overrides this by status, or by
status, body fields and headers (Slack's 200 `{"ok": false}`, GraphQL's `errors`), and
may call an answer `already_exists`: evidence that the effect may exist, to be read.

Transport failures of the addon's own exchange (httpx's exception types; what proves each,
and how that is known, is outcome/exchange_failures.py):
- the connection was never established (ConnectError, which includes TLS handshake
  failures; ConnectTimeout; PoolTimeout) → not_sent;
- our own HTTP client refused the request before writing a byte of it (`local_refusal`:
  a URL or scheme it cannot send, a request head it will not build) → not_sent,
  with the refusal as the reason;
- an HTTP/2 upstream proved it did not process the request (`not_processed`: RST_STREAM
  REFUSED_STREAM, a GOAWAY that excludes its stream) → not_sent;
- the proxy stopped it just before its first byte (`SendStopped`: its lease or its lifetime
  no longer allowed the send, gate/send_guard.py) → not_sent;
- anything after the request could have been written (WriteError, ReadError, ReadTimeout,
  RemoteProtocolError, any other LocalProtocolError, our overall deadline) → outcome_unknown.

Errors of mitmproxy's own forwarding (its `error` hook, `receipts_forward=mitmproxy`). What this
relies on, read in mitmproxy 12.3's `proxy/layers/http/__init__.py` and checked by the
integration tests:
- The addon runs with `connection_strategy=lazy`, so the server connection opens
  after the `request` hook and every upstream failure reaches the flow's error hook.
- `make_server_connection()` assigns `flow.server_conn` only once the connection
  (TCP and, for https, TLS) is up. When opening fails (refused, DNS, unreachable,
  certificate rejected, handshake failed), the flow keeps its placeholder
  connection, whose `timestamp_tcp_setup` is None. No request byte was written →
  not_sent. (The same holds when the agent hangs up before we connect.)
- A TLS connection with `timestamp_tls_setup` None was never usable → not_sent.
- HTTP/2 `REFUSED_STREAM` (RFC 9113 §8.7: the server processed nothing), which
  mitmproxy reports as "stream reset by client (REFUSED_STREAM)" → not_sent.
- Anything else (reset, timeout, half a response, the server closing, the agent
  hanging up while the upstream holds the request, our own upstream deadline)
  happened after the request could have been written → outcome_unknown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy_addon.outcome.exchange_failures import NOT_SENT_ERRORS, NotProcessed, SendStopped, local_refusal, withheld
from proxy_addon.rules import ALREADY_EXISTS, ClassifyRule, Operation
from proxy_addon.states import State
from proxy_addon.store import Interim, RecordedResponse
from proxy_addon.wire.jsonpath import NOT_JSON, dig_all, id_in, parse_json

__all__ = [
    "Outcome",
    "answer_outcome",
    "classify_error",
    "classify_response",
    "classify_status",
    "deadline_outcome",
    "dig_all",
    "error_outcome",
    "external_id_of",
    "failure_outcome",
    "head_outcome",
    "id_in",
    "maybe_sent",
    "never_sent",
    "refused_locally",
    "response_external_id",
    "rule_fits",
]


@dataclass(frozen=True)
class Outcome:
    """What to record of a forwarded write: its state, why, and what the answer told."""

    state: State
    reason: str
    error: str | None = None
    http_status: int | None = None
    external_id: str | None = None
    response: RecordedResponse | None = None
    evidence: bool = False  # the answer says the effect may already exist: a read decides, now
    timed_out: bool = False  # our own deadline passed
    # Not an outcome (`state` stays submitted): the server asked for input, or runs the call as a task
    # (an MCP tool call: outcome/tool_outcomes.py; recorded by store/rounds.py)
    interim: Interim | None = None

    def fields(self) -> dict[str, Any]:
        """The receipt fields `Store.transition` records with the state."""
        out: dict[str, Any] = {"error": self.error} if self.error is not None else {}
        if self.http_status is not None:
            out.update(http_status=self.http_status, response=self.response)
        if self.state is State.SUCCEEDED:
            out.update(external_id=self.external_id)
        return out


def answer_outcome(
    status: int,
    phrase: str,
    headers: Mapping[str, str],
    body: bytes,
    op: Operation | None,
    recorded: RecordedResponse | None = None,
) -> Outcome:
    """The outcome of an upstream answer (`headers` with lower-case names, `body` decoded)."""
    parsed: list[Any] = []  # the body parsed once, for the classify rules and the external id alike
    verdict, why = classify_response(status, headers, body, op, parsed)
    exists = verdict == ALREADY_EXISTS
    state = State.OUTCOME_UNKNOWN if exists else State(verdict)
    reason = f"upstream answered HTTP {status}" + (f": {why}" if why else "")
    if exists:
        reason += " (evidence that the effect may already exist: a read decides)"
    return Outcome(
        state,
        reason,
        error=None if state is State.SUCCEEDED else f"HTTP {status} {phrase}".strip() + (f": {why}" if why else ""),
        http_status=status,
        response=recorded,
        evidence=exists,
        external_id=response_external_id(op, headers, body, parsed) if state is State.SUCCEEDED else None,
    )


def head_outcome(
    status: int,
    phrase: str,
    headers: Mapping[str, str],
    op: Operation | None,
    recorded: RecordedResponse | None,
    why: str,
) -> Outcome:
    """
    The outcome of an answer whose body was not read (`why`: it is larger than
    receipts_response_cap), from its status and headers. When the first of the operation's
    `classify:` rules that fits them tests body fields, the body would have decided: the
    outcome is unknown. Otherwise as `answer_outcome` with no body (no external id from it).
    """
    for rule in op.classify_rules if op is not None else ():
        if rule_fits(dataclasses.replace(rule, body=()), status, headers, b""):
            if rule.body:
                message = (
                    f"outcome unknown: upstream answered HTTP {status}, and the operation's classify rule "
                    f"(line {rule.line}) reads the body, which was not read ({why})"
                )
                return Outcome(State.OUTCOME_UNKNOWN, message, error=message, http_status=status, response=recorded)
            break
    outcome = answer_outcome(status, phrase, headers, b"", op, recorded)
    return dataclasses.replace(outcome, reason=f"{outcome.reason}; classified from the status ({why})")


def failure_outcome(e: BaseException) -> Outcome:
    """The outcome when our own exchange raised instead of answering."""
    if isinstance(e, NotProcessed | SendStopped):
        message = f"not sent: {e}"
        return Outcome(State.NOT_SENT, message, error=message)
    detail = withheld(str(e)) or type(e).__name__
    refusal = local_refusal(e)
    if refusal is not None:
        message = refused_locally(refusal)
        return Outcome(State.NOT_SENT, message, error=message)
    if isinstance(e, NOT_SENT_ERRORS):
        message = never_sent(detail)
        return Outcome(State.NOT_SENT, message, error=message)
    message = maybe_sent(f"{type(e).__name__}: {detail}")
    return Outcome(State.OUTCOME_UNKNOWN, message, error=message)


def deadline_outcome(seconds: float) -> Outcome:
    # A deadline cut to the receipt's in_flight_until (gate/send_guard.py) is a hair under the option's value.
    message = f"outcome unknown: no answer within receipts_upstream_timeout ({round(seconds, 1):g}s)"
    return Outcome(State.OUTCOME_UNKNOWN, message, error=message, timed_out=True)


def classify_response(
    status: int, headers: Mapping[str, str], body: bytes, op: Operation | None = None, parsed: list[Any] | None = None
) -> tuple[str, str | None]:
    """
    The verdict on an answer: a State, or ALREADY_EXISTS (the API says the effect may exist
    already: read to decide), and the reason a `classify:` rule gives, if any. The operation's
    rules are tried in order; then its status map; then the defaults. `parsed`: the body,
    parsed once if a rule looks at it (an empty list, filled then; shared with the caller).
    """
    if op is not None and op.classify_rules:
        parsed = [] if parsed is None else parsed
        for rule in op.classify_rules:
            if rule_fits(rule, status, headers, body, parsed):
                return rule.state, rule.reason
    return classify_status(status, op), None


def rule_fits(
    rule: ClassifyRule, status: int, headers: Mapping[str, str], body: bytes, parsed: list[Any] | None = None
) -> bool:
    """Whether an answer passes every test of a rule (`classify:` entries, `absent_when`)."""
    if rule.statuses and not _status_fits(status, rule.statuses):
        return False
    if rule.headers and not all(check.fits([headers.get(name)]) for name, check in rule.headers):
        return False
    if rule.body:
        parsed = [] if parsed is None else parsed
        if not parsed:
            parsed.append(parse_json(body))
        doc = parsed[0]
        if doc is NOT_JSON or not all(check.fits(dig_all(doc, path)) for path, check in rule.body):
            return False
    return True


def _status_fits(status: int, keys: tuple[str, ...]) -> bool:
    return str(status) in keys or f"{status // 100}xx" in keys


def classify_status(status: int, op: Operation | None = None) -> State | str:
    """The verdict by status: the operation's status map (a State, or ALREADY_EXISTS), else the defaults."""
    if op is not None:
        code, klass = str(status), f"{status // 100}xx"
        for key, verdict in op.classify:
            if key in (code, klass):
                return verdict
    if status < 400:
        return State.SUCCEEDED
    if status == 408:
        return State.OUTCOME_UNKNOWN
    if status == 409:  # a conflict may be with the effect itself (docs/rules.md, "Defaults")
        return ALREADY_EXISTS
    if status < 500:
        return State.REJECTED
    return State.OUTCOME_UNKNOWN


def never_sent(detail: str) -> str:
    return f"not sent: the connection to the upstream was never established ({detail})"


def refused_locally(detail: str) -> str:
    return f"not sent: our HTTP client refused the request before writing any of it ({detail})"


def maybe_sent(detail: str) -> str:
    return f"outcome unknown: the request may have reached the upstream ({detail})"


def error_outcome(
    message: str, *, tcp_setup: float | None, tls: bool, tls_setup: float | None, deadline_passed: bool = False
) -> Outcome:
    """The outcome of a failure in mitmproxy's own forwarding (its `error` hook)."""
    if deadline_passed:
        message = f"no answer within receipts_upstream_timeout ({message})"
    state, reason = classify_error(message, tcp_setup=tcp_setup, tls=tls, tls_setup=tls_setup)
    return Outcome(state, reason, error=message)


def classify_error(message: str, *, tcp_setup: float | None, tls: bool, tls_setup: float | None) -> tuple[State, str]:
    """The state an upstream failure leaves a receipt in, and why."""
    if tcp_setup is None:
        return State.NOT_SENT, never_sent(message)
    if tls and tls_setup is None:
        return State.NOT_SENT, f"not sent: the TLS handshake with the upstream did not complete ({message})"
    if "REFUSED_STREAM" in message:
        return State.NOT_SENT, f"not sent: the upstream refused the HTTP/2 stream ({message})"
    return State.OUTCOME_UNKNOWN, maybe_sent(message)


def external_id_of(body: bytes, dotted: str | tuple[str, ...] | None, parsed: list[Any] | None = None) -> str | None:
    """
    The value at `dotted` in a JSON response body, as a string, or None. Several fields: joined
    with ':'. `parsed`: the body already parsed (rule_fits), else it is parsed and added there.
    """
    if not dotted:
        return None
    parsed = [] if parsed is None else parsed
    if not parsed:
        parsed.append(parse_json(body))
    doc = parsed[0]
    return None if doc is NOT_JSON else id_in(doc, dotted)


def response_external_id(
    op: Operation | None, headers: Mapping[str, str], body: bytes, parsed: list[Any] | None = None
) -> str | None:
    """The created object's id in a success answer: from the header the rule names, or the body (`parsed`: parsed)."""
    if op is None:
        return None
    if op.external_id_header:
        return headers.get(op.external_id_header) or None
    return external_id_of(body, op.external_id, parsed)
