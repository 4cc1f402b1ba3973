"""
What happened to a forwarded request, as a receipt state.

Responses (overridable per operation with `classify:`): 2xx and 3xx → succeeded;
408 → outcome_unknown; other 4xx → rejected; 5xx → outcome_unknown.

Errors (mitmproxy's `error` hook), relying on mitmproxy 12's connection timestamps
with `connection_strategy=lazy` (the server connection opens after the `request`
hook, so every upstream failure reaches the flow's error hook):
- `server_conn.timestamp_tcp_setup is None`: no TCP connection was made (refused,
  DNS failure, unreachable, or the client left before we connected) → not_sent;
- a TLS server connection with `timestamp_tls_setup is None`: the handshake failed
  before any request byte → not_sent;
- HTTP/2 `REFUSED_STREAM` (RFC 9113 §8.7: the server processed nothing) → not_sent;
- anything else (reset, timeout, half a response, the client went away while the
  upstream held the request) → outcome_unknown: it may have been sent.
"""

from __future__ import annotations

import json
from typing import Any

from proxy_addon.fingerprint import dig
from proxy_addon.rules import Operation
from proxy_addon.states import State


def classify_status(status: int, op: Operation | None = None) -> State:
    if op is not None:
        code, klass = str(status), f"{status // 100}xx"
        for key, state in op.classify:
            if key == code or key == klass:
                return state
    if status < 400:
        return State.SUCCEEDED
    if status == 408:
        return State.OUTCOME_UNKNOWN
    if status < 500:
        return State.REJECTED
    return State.OUTCOME_UNKNOWN


def classify_error(
    message: str, *, tcp_setup: float | None, tls: bool, tls_setup: float | None
) -> tuple[State, str]:
    """The state an upstream failure leaves a receipt in, and why."""
    if tcp_setup is None:
        return State.NOT_SENT, f"not sent: no connection to the upstream was made ({message})"
    if tls and tls_setup is None:
        return State.NOT_SENT, f"not sent: the TLS handshake with the upstream did not complete ({message})"
    if "REFUSED_STREAM" in message:
        return State.NOT_SENT, f"not sent: the upstream refused the HTTP/2 stream ({message})"
    return State.OUTCOME_UNKNOWN, f"outcome unknown: the request may have reached the upstream ({message})"


def external_id_of(body: bytes, dotted: str | None) -> str | None:
    """The value at `dotted` in a JSON response body, as a string, or None."""
    if not dotted or not body:
        return None
    try:
        value: Any = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    value = dig(value, dotted)
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)
