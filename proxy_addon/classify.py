"""
What happened to a forwarded request, as a receipt state.

Responses (overridable per operation with `classify:`): 2xx and 3xx → succeeded;
408 → outcome_unknown; other 4xx → rejected; 5xx → outcome_unknown.

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
