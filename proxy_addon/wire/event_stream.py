"""
An event stream (`text/event-stream`, the WHATWG HTML "server-sent events" format) read as it
arrives, one event at a time, in bounded memory: MCP's Streamable HTTP answers a request with
one, each event's `data` carrying one JSON-RPC message.

    events = EventStream(limit=1 << 20)
    for piece in events.feed(chunk):  # in stream order; every byte of every chunk is in one piece
        piece.raw                     # bytes of the stream, as they came (to pass on)
        piece.ends                    # `raw` ends an event (else: part of one too large to read)
        piece.event                   # that event, read whole; None: too large to read, or not ended
    piece = events.end()              # at the stream's end: the bytes of an event it left unfinished

How it reads (as the spec's parser does): lines end with CRLF, LF or CR (a CR that ends one
chunk and an LF that starts the next are one line end); a blank line ends an event; a line
starting with `:` is a comment; `data` lines are joined with LF; `event`, `id` and `retry` are
not needed here and are skipped; a BOM before the first line is ignored.

Bound: the bytes of the event being read are held until it ends, up to `limit`. An event
larger than that is not read: what was held of it is given back at once (`event` None), and so
is the rest of it as it comes, so that it passes on without being held; `too_large` counts
those. An event whose bytes add up to more than `limit` is never read, whichever chunks it came in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\n|\r")
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Event:
    """One event, read whole: its `data` lines joined with LF (None: it had no `data` line, as a comment block)."""

    data: bytes | None


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes of the stream, in order: `ends` when they end an event; `event` is that event, when it was read whole."""

    raw: bytes
    ends: bool = False
    event: Event | None = None


class EventStream:
    """An event stream fed as it arrives (module docstring); one instance per stream."""

    __slots__ = ("_data", "_held", "_line", "_line_open", "_skip_lf", "_skipping", "_started", "limit", "too_large")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.too_large = 0  # events given back unread: larger than `limit`
        self._held = bytearray()  # the current event's bytes so far (not yet given back)
        self._line = bytearray()  # the current line's bytes so far (only while the event is read)
        self._line_open = False  # the current line has bytes (a blank line ends the event)
        self._data: list[bytes] = []  # the current event's data lines
        self._skipping = False  # the current event passed `limit`: given back as it comes, unread
        self._skip_lf = False  # the last byte was a CR: an LF first in the next chunk ends no line
        self._started = False  # the first line was read (its BOM, if any, skipped)

    def feed(self, chunk: bytes) -> list[Piece]:
        """The pieces that `chunk` completes, in order (the module docstring says what they hold)."""
        out: list[Piece] = []
        pos = begin = 0  # pos: where the next line starts; begin: the first byte not yet held or given back
        if self._skip_lf and chunk[:1] == b"\n":
            pos = 1
        self._skip_lf = False
        for m in _LINE_END.finditer(chunk, pos):
            part = chunk[pos : m.start()]
            pos = m.end()
            if not self._line_open and not part:  # a blank line: the event ends here
                raw = chunk[begin:pos]
                if self._held:
                    raw = bytes(self._held) + raw
                out.append(self._dispatch(raw))
                begin = pos
                continue
            if not self._skipping:
                self._field(bytes(self._line) + part if self._line else part)
            self._line.clear()
            self._line_open = False
        if chunk.endswith(b"\r"):
            self._skip_lf = True
        rest = chunk[pos:]
        if rest:
            self._line_open = True
            if not self._skipping:
                self._line += rest
        tail = chunk[begin:]
        if self._skipping:
            if tail:
                out.append(Piece(tail))
        else:
            self._held += tail
            if len(self._held) > self.limit:  # too large to read: given back now, and the rest as it comes
                self._skipping = True
                self.too_large += 1
                out.append(Piece(bytes(self._held)))
                self._held.clear()
                self._line.clear()
                self._data.clear()
        return out

    def end(self) -> Piece | None:
        """
        At the stream's end: the bytes of the event it left unfinished (no blank line after it), or
        None. Its `event` is that event read as if a blank line had ended it (None if too large):
        the spec's parser drops such an event, so a client never acts on it.
        """
        if not self._held and not self._line_open:
            return None
        if self._line_open and not self._skipping:
            self._field(bytes(self._line))
        piece = Piece(bytes(self._held)) if self._skipping else self._dispatch(bytes(self._held))
        piece = Piece(piece.raw, False, piece.event)  # not ended: no blank line came
        self._line.clear()
        self._line_open = False
        return piece if piece.raw else None

    def _field(self, line: bytes) -> None:
        if not self._started:
            self._started = True
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        name, colon, value = line.partition(b":")
        if name == b"data":
            self._data.append(value[1:] if colon and value.startswith(b" ") else value)

    def _dispatch(self, raw: bytes) -> Piece:
        """The piece that ends the current event; the next event starts empty."""
        read = not self._skipping and len(raw) <= self.limit
        if not self._skipping and not read:
            self.too_large += 1
        event = Event(b"\n".join(self._data) if self._data else None) if read else None
        self._held.clear()
        self._data = []
        self._skipping = False
        return Piece(raw, True, event)
