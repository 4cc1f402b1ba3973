"""
An event stream read as it arrives (proxy_addon/wire/event_stream.py) and a tool call's answer read
so (wire/call_answer.py): the same events whatever chunks the stream comes in, every byte given
back in order, an event larger than the bound given back unread as it comes, and each JSON-RPC
message told apart: the call's response, a notification, a request of the server's own.
"""

from __future__ import annotations

import json
import random

from proxy_addon.wire.call_answer import CallAnswer
from proxy_addon.wire.event_stream import Event, EventStream
from proxy_addon.wire.jsonrpc import messages_of


def message(**fields) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **fields}, separators=(",", ":")).encode()


STREAM = (
    b"\xef\xbb\xbf: ping\r\n\r\n"  # a BOM, then a comment block
    + b"event: message\r\ndata: "
    + message(method="notifications/progress", params={"progress": 1})
    + b"\r\n\r\n"
    + b"data: "
    + message(id="s1", method="elicitation/create", params={})
    + b"\n\n"  # the server's own request
    + b'data: {"jsonrpc": "2.0",\ndata: "id": 9, "result": {}}\n\n'  # another id's response, in two data lines
    + b"id: 5\rdata: "
    + message(id=7, result={"content": []})
    + b"\r\r"  # the call's response, CR line ends
    + b"data: "
    + message(id=7, result={"second": True})
    + b"\n\n"
    + b"data: unfinished"
)


def split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, 12)))
    return [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def read(chunks: list[bytes], limit: int = 1 << 20):
    events = EventStream(limit)
    pieces = [p for c in chunks for p in events.feed(c)]
    return pieces, events.end()


def test_any_chunking_gives_the_same_events_and_every_byte_in_order():
    whole, last = read([STREAM])
    assert [p.event for p in whole] == [
        Event(None),
        Event(message(method="notifications/progress", params={"progress": 1})),
        Event(message(id="s1", method="elicitation/create", params={})),
        Event(b'{"jsonrpc": "2.0",\n"id": 9, "result": {}}'),
        Event(message(id=7, result={"content": []})),
        Event(message(id=7, result={"second": True})),
    ]
    assert last is not None and last.raw == b"data: unfinished" and not last.ends
    rng = random.Random(24)
    for _ in range(500):
        pieces, end = read(split(STREAM, rng))
        assert [p.event for p in pieces if p.ends] == [p.event for p in whole]
        assert b"".join(p.raw for p in pieces) + (end.raw if end else b"") == STREAM
    # A whole body read at once (a recorded answer) keeps the event its end left unfinished.
    assert [m.get("id") for m in messages_of(STREAM, "text/event-stream")] == [None, "s1", 9, 7, 7]


def test_an_event_larger_than_the_bound_is_given_back_unread_as_it_comes():
    big = b"data: " + message(id=7, result={"pad": "x" * 5000}) + b"\n\n"
    small = b"data: " + message(method="notifications/message", params={}) + b"\n\n"
    stream = small + big + small
    rng = random.Random(7)
    for _ in range(200):
        events = EventStream(limit=1000)
        pieces = [p for c in split(stream, rng) for p in events.feed(c)]
        assert b"".join(p.raw for p in pieces) == stream
        assert [p.event.data for p in pieces if p.event] == [small[6:-2], small[6:-2]]
        assert events.too_large == 1
    # Coming in small chunks, it is given back once the bound is passed, before it ends: never held whole.
    events = EventStream(limit=1000)
    pieces = [p for i in range(0, len(stream), 100) for p in events.feed(stream[i : i + 100])]
    given = [p for p in pieces if not p.ends]
    assert given and len(given[0].raw) <= 1100 and sum(len(p.raw) for p in given) < len(big)


def test_a_call_answer_tells_its_response_from_notifications_and_server_requests():
    answer = CallAnswer(7, limit=1 << 20)
    rng = random.Random(3)
    parts = [p for c in split(STREAM, rng) for p in answer.feed(c)]
    kinds = [p.kind for p in parts]
    assert [k for k in kinds if k != "partial"] == ["other", "notification", "request", "other", "response", "other"]
    assert answer.response == {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}  # the first one with its id
    assert answer.response_event.startswith(b"id: 5\rdata: ") and b"second" not in answer.response_event
    assert answer.end() == b"data: unfinished"
    assert CallAnswer("7", limit=100).feed(b"data: " + message(id=7, result={}) + b"\n\n")[0].kind == "other"
