"""
JSON-RPC messages as MCP's Streamable HTTP carries them: a POST's answer is either
`application/json` (one message, or a list) or `text/event-stream`, whose events' `data:`
lines carry one message each (the server may send notifications and requests before the
response). The client picks the response whose `id` is its request's.

    messages_of(body, "text/event-stream")   # every JSON-RPC message in the answer, in order
    response_for(body, ctype, 7)              # the response to request 7, or None
    kind_of(message, 7)                       # "response" (to request 7), "request", "notification" or "other"
    framed({"jsonrpc": "2.0", ...}, sse=True) # (content type, bytes) of one message

An event stream read as it arrives, one event at a time, is wire/event_stream.py; a tool call's
answer read so, wire/call_answer.py.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from proxy_addon.wire.event_stream import EventStream
from proxy_addon.wire.jsonpath import NOT_JSON, parse_json

Kind = Literal["response", "request", "notification", "other"]


def is_sse(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "text/event-stream"


def messages_of(body: bytes, content_type: str | None) -> list[dict[str, Any]]:
    """The JSON-RPC messages (objects) an answer holds; what is not one is skipped."""
    if is_sse(content_type):
        docs = [parse_json(data) for data in _sse_data(body)]
    else:
        doc = parse_json(body)
        docs = doc if isinstance(doc, list) else [doc]
    return [d for d in docs if isinstance(d, dict)]


def _sse_data(body: bytes) -> list[bytes]:
    """
    The `data` of each event of a whole event stream, as the spec's parser reads them; an event
    the stream leaves unfinished at its end is read too (a body recorded or held whole).
    """
    events = EventStream(limit=len(body))
    pieces = events.feed(body)
    if (last := events.end()) is not None:
        pieces.append(last)
    return [p.event.data for p in pieces if p.event is not None and p.event.data is not None]


def same_id(a: Any, b: Any) -> bool:
    """JSON-RPC ids are strings or numbers: 1 and "1" are two ids, and true is none."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def kind_of(message: dict[str, Any], request_id: Any) -> Kind:
    """
    What a JSON-RPC message is to the request with this id: its "response" (a `result` or an
    `error` with its id), a "request" of the server's own (a method and an id: a client answers
    it), a "notification" (a method, no id), or "other" (a response to another id, not JSON-RPC).
    """
    if "method" in message:
        return "request" if message.get("id") is not None else "notification"
    if ("result" in message or "error" in message) and same_id(message.get("id"), request_id):
        return "response"
    return "other"


def response_for(body: bytes, content_type: str | None, request_id: Any) -> dict[str, Any] | None:
    """The JSON-RPC response (a `result` or an `error`) to the request with this id, or None."""
    for msg in messages_of(body, content_type):
        if kind_of(msg, request_id) == "response":
            return msg
    return None


def framed(message: dict[str, Any], *, sse: bool) -> tuple[str, bytes]:
    """One JSON-RPC message as an answer's body: JSON, or an event stream of one `message` event."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    if sse:
        return "text/event-stream", f"event: message\ndata: {text}\n\n".encode()
    return "application/json", text.encode()


def wants_sse(accept: str | None, recorded_sse: bool) -> bool:
    """
    The framing of an answer the proxy writes: an event stream when the recorded answer was one
    and the client accepts it, or when the client accepts only that; JSON otherwise.
    """
    kinds = {part.split(";")[0].strip().lower() for part in (accept or "").split(",")}
    takes_sse, takes_json = "text/event-stream" in kinds, bool(kinds & {"application/json", "*/*", "application/*"})
    if recorded_sse and takes_sse:
        return True
    return takes_sse and not takes_json


__all__ = ["NOT_JSON", "Kind", "framed", "is_sse", "kind_of", "messages_of", "response_for", "same_id", "wants_sse"]
