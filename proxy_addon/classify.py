"""
What happened to a forwarded request, as a receipt state.

Responses: 2xx and 3xx → succeeded; 408 → outcome_unknown; other 4xx → rejected;
5xx → outcome_unknown. An operation's `classify:` overrides this by status, or by
status, body fields and headers (Slack's 200 `{"ok": false}`, GraphQL's `errors`), and
may call an answer `already_exists`: evidence that the effect may exist, to be read.

Errors (mitmproxy's `error` hook). What this relies on, read in mitmproxy 12.3's
`proxy/layers/http/__init__.py` and checked by the integration tests:
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

import json
from collections.abc import Mapping
from typing import Any

from proxy_addon.fingerprint import dig
from proxy_addon.rules import ClassifyRule, Operation
from proxy_addon.states import State


def classify_response(status: int, headers: Mapping[str, str], body: bytes, op: Operation | None = None) -> tuple[str, str | None]:
    """
    The verdict on an answer: a State, or ALREADY_EXISTS (the API says the effect may exist
    already: read to decide), and the reason a `classify:` rule gives, if any. The operation's
    rules are tried in order; then its status map; then the defaults.
    """
    if op is not None and op.classify_rules:
        parsed: list[Any] = []  # the body, parsed once if a rule looks at it
        for rule in op.classify_rules:
            if rule_fits(rule, status, headers, body, parsed):
                return rule.state, rule.reason
    return classify_status(status, op), None


def rule_fits(rule: ClassifyRule, status: int, headers: Mapping[str, str], body: bytes,
              parsed: list[Any] | None = None) -> bool:
    """Whether an answer passes every test of a rule (`classify:` entries, `absent_when`)."""
    if rule.statuses and not _status_fits(status, rule.statuses):
        return False
    if rule.headers and not all(check.fits([headers.get(name)]) for name, check in rule.headers):
        return False
    if rule.body:
        parsed = [] if parsed is None else parsed
        if not parsed:
            parsed.append(_json(body))
        doc = parsed[0]
        if doc is _UNPARSED or not all(check.fits(dig_all(doc, path)) for path, check in rule.body):
            return False
    return True


_UNPARSED = object()


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else _UNPARSED
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _UNPARSED


def _status_fits(status: int, keys: tuple[str, ...]) -> bool:
    return str(status) in keys or f"{status // 100}xx" in keys


def dig_all(value: Any, dotted: str) -> list[Any]:
    """Every value at a dotted path where `*` is any item of a list; [None] when there is none."""
    values = [value]
    for part in dotted.split("."):
        nxt = []
        for v in values:
            if part == "*" and isinstance(v, list):
                nxt += v
            elif isinstance(v, dict) and part in v:
                nxt.append(v[part])
            elif isinstance(v, list) and part.isdecimal() and int(part) < len(v):
                nxt.append(v[int(part)])
        values = nxt
    return values or [None]


def classify_status(status: int, op: Operation | None = None) -> State:
    if op is not None:
        code, klass = str(status), f"{status // 100}xx"
        for key, state in op.classify:
            if key == code or key == klass:
                return state  # type: ignore[return-value]  # ALREADY_EXISTS is handled by the caller
    if status < 400:
        return State.SUCCEEDED
    if status == 408:
        return State.OUTCOME_UNKNOWN
    if status < 500:
        return State.REJECTED
    return State.OUTCOME_UNKNOWN


def never_sent(detail: str) -> str:
    return f"not sent: the connection to the upstream was never established ({detail})"


def maybe_sent(detail: str) -> str:
    return f"outcome unknown: the request may have reached the upstream ({detail})"


def classify_error(
    message: str, *, tcp_setup: float | None, tls: bool, tls_setup: float | None
) -> tuple[State, str]:
    """The state an upstream failure leaves a receipt in, and why."""
    if tcp_setup is None:
        return State.NOT_SENT, never_sent(message)
    if tls and tls_setup is None:
        return State.NOT_SENT, f"not sent: the TLS handshake with the upstream did not complete ({message})"
    if "REFUSED_STREAM" in message:
        return State.NOT_SENT, f"not sent: the upstream refused the HTTP/2 stream ({message})"
    return State.OUTCOME_UNKNOWN, maybe_sent(message)


def external_id_of(body: bytes, dotted: str | tuple[str, ...] | None) -> str | None:
    """The value at `dotted` in a JSON response body, as a string, or None. Several fields: joined with ':'."""
    if not dotted or not body:
        return None
    try:
        doc: Any = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return id_in(doc, dotted)


def id_in(doc: Any, dotted: str | tuple[str, ...]) -> str | None:
    """The id at a dotted field (or the fields joined with ':') of parsed JSON, or None if any is missing."""
    parts = []
    for path in (dotted,) if isinstance(dotted, str) else dotted:
        value = dig(doc, path)
        if value is None or isinstance(value, (dict, list)):
            return None
        parts.append(value if isinstance(value, str) else json.dumps(value))
    return ":".join(parts)


def response_external_id(op: Operation | None, headers: Mapping[str, str], body: bytes) -> str | None:
    """The created object's id in a success answer: from the header the rule names, or the body."""
    if op is None:
        return None
    if op.external_id_header:
        return headers.get(op.external_id_header) or None
    return external_id_of(body, op.external_id)
