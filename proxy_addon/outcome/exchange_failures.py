"""
What a failure of the addon's own exchange (mitm/exchange.py) proves: that no byte of the
request was written, or that the upstream did not process it (not_sent), or neither
(outcome_unknown). outcome/classify.py (`failure_outcome`) turns these proofs into a state.

    CLIENT_ERRORS                  # what the exchange catches: httpx's errors, h11's, and the two below
    local_refusal(exc)             # our HTTP client refused before writing a byte: why, else None
    not_processed(exc, stream_id)  # an HTTP/2 upstream proved it did not process the stream: why, else None
    NOT_SENT_ERRORS                # the connection was never established

The connection was never established (httpx.ConnectError, which includes TLS handshake
failures; ConnectTimeout; PoolTimeout: `NOT_SENT_ERRORS`): nothing was written → not_sent.
The proxy stopped the request itself just before its first byte (`SendStopped`: its lease or
its lifetime no longer allowed it, gate/send_guard.py): nothing was written → not_sent.

Which local refusals prove that nothing left (read in httpx 0.28, httpcore 1.0 and h11 0.16):
- httpx.InvalidURL is raised while the URL is built (exchange.send, before `client.send`)
  and httpx.UnsupportedProtocol by the transport before it opens a connection: not_sent.
- HTTP/1.1 (httpcore/_async/http11.py): `handle_async_request` writes a request in order:
  `_send_request_headers` builds the head (`h11.Request(...)`, which validates header names
  and values, the single Host, the method and the target) inside
  `map_exceptions({h11.LocalProtocolError: LocalProtocolError})`, then `_send_event` asks
  h11 for the bytes (`h11.Connection.send`, which raises before returning any) and only
  then writes them; a failed write is a WriteError, never a LocalProtocolError. So a
  LocalProtocolError (httpcore's, or h11's own escaping unmapped from `_send_event`) raised
  inside `HTTP11Connection._send_request_headers` means no byte of the request was written:
  not_sent. The proof is the traceback (the frame it was raised under), not the message.
  Once `_send_request_body` runs, the head has been written: an h11 LocalProtocolError
  from there ("Too little data for declared Content-Length", which httpcore does not map,
  so it escapes httpx as h11's own type) → outcome_unknown.
- The exchange's own HTTP/1.1 (mitm/http1.py): `_h11_request_bytes` asks h11 for the
  request's bytes, head and body, before any is written; h11's LocalProtocolError raised
  under it (passed on as httpx's, raised from h11's) → not_sent, by the same traceback proof.
- HTTP/2 (httpcore/_async/http2.py): any h2 ProtocolError, raised while sending the
  headers, the body or reading the answer, becomes the same LocalProtocolError in
  `handle_async_request`'s handler: no frame tells where → outcome_unknown.

What the upstream itself proves over HTTP/2 (RFC 9113 §8.7: a request on a stream the server
refused, or above the last-stream-id of its GOAWAY, was not processed and can be retried),
read in httpcore 1.0 and checked against tests/upstream_h2.py (`not_processed`):
- RST_STREAM with REFUSED_STREAM on the request's stream, before the answer's head: httpcore
  raises RemoteProtocolError(StreamReset) → not_sent. Any other error code (INTERNAL_ERROR,
  CANCEL, ...) → outcome_unknown.
- GOAWAY whose last-stream-id is below the request's stream: httpcore raises
  RemoteProtocolError(ConnectionTerminated) when the last-stream-id is 0, and otherwise
  ConnectionNotAvailable from `_receive_events`, upon which its connection pool SENDS THE
  REQUEST AGAIN on a new connection. The exchange stops that (mitm/httpcore_send.py,
  `_Trace`): the trace hook turns the proof into `NotProcessed` before the pool sees it →
  not_sent, and the agent's own retry is the second attempt, with its own receipt. A GOAWAY that includes the
  stream, or a connection closed without one → outcome_unknown.
The stream is the one httpcore reports for this request (its `send_request_headers` trace);
a failure while reading the answer's body is never a proof. A REFUSED_STREAM that comes while
a large body is still being sent reaches httpcore as an h2 StreamClosedError (LocalProtocolError,
above): outcome_unknown, the safe side.
The messages of these errors quote header values (credentials among them): they are kept
with each quoted value withheld.
"""

from __future__ import annotations

import re
import traceback

import h2.errors
import h2.events
import h11
import httpcore
import httpx

__all__ = [
    "CLIENT_ERRORS",
    "NOT_SENT_ERRORS",
    "REFUSED_ERRORS",
    "NotProcessed",
    "SendStopped",
    "SentTwice",
    "local_refusal",
    "not_processed",
    "withheld",
]

NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Refused by httpx before a connection is opened: the URL cannot be built, the scheme is not http(s).
REFUSED_ERRORS = (httpx.InvalidURL, httpx.UnsupportedProtocol)


class NotProcessed(Exception):
    """
    The upstream proved, over HTTP/2, that it did not process the request (`not_processed`).
    Raised by the exchange from httpcore's trace hook, so that httpcore does not send it again.
    """


class SentTwice(Exception):
    """httpcore was about to send the request a second time: stopped before a byte of it was written."""


class SendStopped(Exception):
    """
    The proxy may no longer send this committed request (gate/send_guard.py: its lease, its lifetime):
    stopped just before its first byte was written (http1.py; httpcore's trace hook) → not_sent.
    """


# What our exchange's client may raise: httpx's own errors, h11's when httpcore does not map them, and ours.
CLIENT_ERRORS = (httpx.HTTPError, httpx.InvalidURL, h11.ProtocolError, NotProcessed, SentTwice, SendStopped)
# Where httpcore, and the exchange's own HTTP/1.1 (mitm/http1.py), build a request head and ask h11 for its
# bytes, before writing any.
_HEAD_BUILDERS = frozenset(
    {"AsyncHTTP11Connection._send_request_headers", "HTTP11Connection._send_request_headers", "_h11_request_bytes"}
)
# Where httpcore raises ConnectionNotAvailable for a stream above a GOAWAY's last-stream-id.
_GOAWAY_CHECKS = frozenset({"AsyncHTTP2Connection._receive_events", "HTTP2Connection._receive_events"})
_QUOTED = re.compile(r"(?<!\w)(?:b'(?:[^'\\]|\\.)*'" + "|" + r'b"(?:[^"\\]|\\.)*")')


def local_refusal(e: BaseException) -> str | None:
    """
    What our own HTTP client refused, when it provably refused before writing a byte of the
    request (the module docstring says how that is known); None otherwise.
    """
    if isinstance(e, REFUSED_ERRORS):
        return f"{type(e).__name__}: {withheld(str(e)) or 'refused'}"
    seen: list[BaseException] = []
    cause: BaseException | None = e
    while cause is not None and len(seen) < 8:  # e, then what it was raised from
        seen.append(cause)
        cause = cause.__cause__
    local = httpx.LocalProtocolError | httpcore.LocalProtocolError | h11.LocalProtocolError
    for error in seen:
        if isinstance(error, local) and _raised_under(error, _HEAD_BUILDERS):
            return f"LocalProtocolError: {withheld(str(e)) or 'refused'}"
    return None


def not_processed(e: BaseException, stream_id: int | None) -> str | None:
    """
    Why the upstream provably did not process the request on HTTP/2 stream `stream_id`, when
    httpcore's exception `e` (raised before the answer's head was read) proves it; None otherwise.
    The module docstring lists what proves it.
    """
    if stream_id is None:
        return None
    event = e.args[0] if isinstance(e, httpcore.RemoteProtocolError) and e.args else None
    if isinstance(event, h2.events.StreamReset):
        if (
            event.stream_id == stream_id
            and event.remote_reset
            and event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
        ):
            return (
                f"the upstream refused HTTP/2 stream {stream_id} (RST_STREAM REFUSED_STREAM): "
                "not processed (RFC 9113 §8.7)"
            )
        return None
    if isinstance(event, h2.events.ConnectionTerminated):
        return _goaway_excludes(event.last_stream_id, stream_id, event.error_code)
    if isinstance(e, httpcore.ConnectionNotAvailable):
        frames = [frame for frame, _ in traceback.walk_tb(e.__traceback__)]
        if frames and frames[-1].f_code.co_qualname in _GOAWAY_CHECKS:  # raised right there, by that check
            last, checked = frames[-1].f_locals.get("last_stream_id"), frames[-1].f_locals.get("stream_id")
            if isinstance(last, int) and checked == stream_id:
                return _goaway_excludes(last, stream_id, None)
    return None


def _goaway_excludes(last: int | None, stream_id: int, code: object) -> str | None:
    if last is None or last >= stream_id:
        return None
    why = f", {code.name}" if isinstance(code, h2.errors.ErrorCodes) else ""
    return (
        f"the upstream's GOAWAY (last-stream-id {last}{why}) excludes HTTP/2 stream {stream_id}: "
        "not processed (RFC 9113 §6.8, §8.7)"
    )


def _raised_under(e: BaseException, functions: frozenset[str]) -> bool:
    """Whether `e` was raised inside one of `functions` (qualified names), by its traceback."""
    return any(frame.f_code.co_qualname in functions for frame, _ in traceback.walk_tb(e.__traceback__))


def withheld(text: str) -> str:
    """`text` with each quoted bytes value (`b'...'`, as h11 quotes a header value) replaced: it may be a secret."""
    return _QUOTED.sub("(value withheld)", text)
