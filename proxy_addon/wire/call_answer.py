"""
A tool call's event-stream answer (Streamable HTTP: `text/event-stream`) read as it arrives, so
that it can be passed on as it comes and classified as soon as the call's response is in it. On
the call's stream the server may send, before that response, notifications (progress, log
messages) and requests of its own (a client answers those on another POST), then the response.

    answer = CallAnswer(call_id, limit=cap)
    for part in answer.feed(chunk):  # in stream order; every byte of the chunk is in one part
        part.raw                     # the bytes, to pass on as they came
        part.kind                    # "response": the call's own (answer.response holds it, and
                                     #   answer.response_event the bytes of its event);
                                     # "request", "notification", "other" (jsonrpc.kind_of; "other":
                                     #   a comment, an event that is no JSON-RPC message, a response
                                     #   to another id); "partial": part of an event not yet ended,
                                     #   too large to read (wire/event_stream.py)
    answer.end()                     # at the end: the bytes of an unfinished event (never read)
    answer.mid_event                 # a "partial" part was given and its event has not ended

One event is held at a time, up to `limit` bytes (wire/event_stream.py); nothing else is kept but the
response's event, which is what the receipt records. The first response with the call's id
counts (jsonrpc.response_for reads a whole answer the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy_addon.wire.event_stream import EventStream
from proxy_addon.wire.jsonpath import parse_json
from proxy_addon.wire.jsonrpc import Kind, kind_of

PartKind = Kind | Literal["partial"]


@dataclass(frozen=True, slots=True)
class Part:
    raw: bytes
    kind: PartKind


class CallAnswer:
    """The event-stream answer to the tool call with `call_id`, fed as it arrives (module docstring)."""

    __slots__ = ("_events", "call_id", "mid_event", "response", "response_event")

    def __init__(self, call_id: Any, *, limit: int) -> None:
        self.call_id = call_id
        self._events = EventStream(limit)
        self.response: dict[str, Any] | None = None  # the call's response, once read
        self.response_event = b""  # the bytes of its event
        self.mid_event = False

    @property
    def too_large(self) -> int:
        """Events passed on unread: larger than the limit (one of them may have been the response)."""
        return self._events.too_large

    def feed(self, chunk: bytes) -> list[Part]:
        parts = []
        for piece in self._events.feed(chunk):
            event = piece.event
            self.mid_event = not piece.ends
            if event is None:
                parts.append(Part(piece.raw, "other" if piece.ends else "partial"))
                continue
            message = parse_json(event.data) if event.data is not None else None
            kind = kind_of(message, self.call_id) if isinstance(message, dict) else "other"
            if kind == "response" and self.response is None:
                assert isinstance(message, dict)
                self.response, self.response_event = message, piece.raw
            elif kind == "response":
                kind = "other"  # a second response with the call's id: the first one counts
            parts.append(Part(piece.raw, kind))
        return parts

    def end(self) -> bytes:
        """The bytes of an event the stream left unfinished: a client's parser drops it, so it is never read."""
        piece = self._events.end()
        return piece.raw if piece is not None else b""
