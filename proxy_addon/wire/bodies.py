"""
Request bodies as the API will read them: `Content-Encoding` decoded, within a bound.

    body = decode_body(raw, headers.get("content-encoding"), limit=cap)

- Codings: gzip (and its alias x-gzip; several gzip members in a row too), deflate (the
  zlib format RFC 9110 names, or raw deflate as some clients send it), br, zstd (several
  frames too) and identity. Stacked codings (`gzip, br`) are undone last-applied first.
- The bound: the result, and every stage of a stacked decoding, is at most `limit` bytes.
  Each decompressor is asked for at most a chunk of output at a time and stops as soon as
  the output passes `limit`, so a decompression bomb costs at most `limit` plus a chunk of
  memory before `BodyTooLarge` is raised. A body with no coding longer than `limit` raises
  it too.
- Errors: `UnsupportedEncoding` for a coding it does not know (compress, a typo),
  `BadEncoding` for a corrupt or truncated stream, trailing bytes after the last
  member or frame, or more than `MAX_CODINGS` codings (UnsupportedEncoding is a
  BadEncoding). All three are in proxy_addon.errors.

What the fingerprint reads (fingerprint.RequestView.body) is this decoded body: the same
JSON sent plain, gzip-encoded at any level, deflated, as br or zstd is one intent.
"""

from __future__ import annotations

import sys
import zlib
from collections import deque
from collections.abc import Callable

import brotli

from proxy_addon.errors import BadEncoding, BodyTooLarge, UnsupportedEncoding

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

CHUNK = 64 * 1024  # bytes of input fed, and of output asked for, per call to a decompressor
MAX_CODINGS = 4  # more stacked codings than any client sends: refused as BadEncoding

KNOWN = ("gzip", "x-gzip", "deflate", "br", "zstd", "identity")


def codings(content_encoding: str | None) -> list[str]:
    """The codings of a Content-Encoding value in the order they were applied, lower-case, identity left out."""
    names = [c.strip().lower() for c in (content_encoding or "").split(",")]
    return [c for c in names if c and c != "identity"]


def decode_body(raw: bytes, content_encoding: str | None, *, limit: int) -> bytes:
    """
    `raw` with every coding of `content_encoding` undone (last applied first), at most `limit` bytes.

    Raises BodyTooLarge past `limit`, UnsupportedEncoding for a coding it does not know,
    BadEncoding for a corrupt or truncated stream. An empty body is empty whatever the header says.
    """
    applied = codings(content_encoding)
    for coding in applied:
        if coding not in DECODERS:
            raise UnsupportedEncoding(
                f"the request body's Content-Encoding {coding!r} is not one the proxy can decode "
                f"(it knows {', '.join(KNOWN)}); nothing was sent",
                encoding=coding,
            )
    if len(applied) > MAX_CODINGS:
        raise BadEncoding(
            f"the request body's Content-Encoding stacks {len(applied)} codings ({content_encoding}); "
            f"the proxy decodes at most {MAX_CODINGS}; nothing was sent",
            encoding=content_encoding,
        )
    body = raw
    for coding in reversed(applied):
        if not body:
            break
        body = DECODERS[coding](body, limit)
    if len(body) > limit:
        raise BodyTooLarge(limit)
    return body


class _Output:
    """Decompressed bytes gathered up to `limit`: adding past it raises BodyTooLarge at once."""

    def __init__(self, limit: int, coding: str):
        self.limit, self.coding = limit, coding
        self.data = bytearray()

    @property
    def room(self) -> int:
        """How much output to ask a decompressor for next: a chunk, and never past limit + 1."""
        return max(1, min(CHUNK, self.limit + 1 - len(self.data)))

    def add(self, piece: bytes) -> None:
        self.data += piece
        if len(self.data) > self.limit:
            raise BodyTooLarge(self.limit, encoding=self.coding)

    def bytes(self) -> bytes:
        out = bytes(self.data)
        self.data = bytearray()
        return out


def _bad(coding: str, why: str) -> BadEncoding:
    return BadEncoding(f"the request body is not valid {coding} ({why}); nothing was sent", encoding=coding)


def _chunks(data: bytes) -> deque[memoryview]:
    view = memoryview(data)
    return deque(view[i : i + CHUNK] for i in range(0, len(view), CHUNK))


def _zlib(data: bytes, limit: int, coding: str, wbits: int, *, members: bool) -> bytes:
    """gzip (wbits 31, one member after another, zero padding allowed) or deflate (15: zlib format, -15: raw)."""
    out = _Output(limit, coding)
    pending = _chunks(data)
    d = zlib.decompressobj(wbits)
    try:
        while pending:
            piece: bytes | memoryview = pending.popleft()
            while True:
                room = out.room
                produced = d.decompress(piece, room)
                out.add(produced)
                piece = d.unconsumed_tail
                if d.eof or (not piece and len(produced) < room):
                    break
            if d.eof and (d.unused_data or pending):
                if d.unused_data:
                    pending.appendleft(memoryview(d.unused_data))
                if not members:
                    raise _bad(coding, "bytes after the end of the stream")
                if pending[0][0] == 0:  # padding after the last member (gzip(1) accepts it): zeros only
                    if any(bytes(p).strip(b"\0") for p in pending):
                        raise _bad(coding, "bytes after the end of the stream")
                    break
                d = zlib.decompressobj(wbits)  # the next gzip member
    except zlib.error as e:
        raise _bad(coding, str(e)) from None
    if not d.eof:
        raise _bad(coding, "the stream is truncated")
    return out.bytes()


def _gzip(data: bytes, limit: int) -> bytes:
    return _zlib(data, limit, "gzip", 16 + zlib.MAX_WBITS, members=True)


def _deflate(data: bytes, limit: int) -> bytes:
    # RFC 9110 §8.4.1.2: "deflate" is the zlib format (RFC 1950); some clients send raw deflate
    # (RFC 1951) instead, as browsers and mitmproxy accept. A zlib header says which.
    zlib_format = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return _zlib(data, limit, "deflate", zlib.MAX_WBITS if zlib_format else -zlib.MAX_WBITS, members=False)


def _br(data: bytes, limit: int) -> bytes:
    out = _Output(limit, "br")
    d = brotli.Decompressor()
    try:
        for piece in _chunks(data):
            if d.is_finished():
                raise _bad("br", "bytes after the end of the stream")
            out.add(d.process(bytes(piece), output_buffer_limit=out.room))
            while not d.is_finished():  # output held back by the limit: drain it before more input
                produced = d.process(b"", output_buffer_limit=out.room)
                out.add(produced)
                if not produced and d.can_accept_more_data():
                    break
    except brotli.error as e:
        raise _bad("br", str(e) or "corrupt stream") from None
    if not d.is_finished():
        raise _bad("br", "the stream is truncated")
    return out.bytes()


def _zstd(data: bytes, limit: int) -> bytes:
    out = _Output(limit, "zstd")
    pending = _chunks(data)
    d = zstd.ZstdDecompressor()
    try:
        while pending:
            piece: bytes | memoryview = pending.popleft()
            while True:
                out.add(d.decompress(piece, out.room))
                if d.eof or d.needs_input:
                    break
                piece = b""  # more output waits for the same input
            if d.eof and (d.unused_data or pending):
                if d.unused_data:
                    pending.appendleft(memoryview(d.unused_data))
                d = zstd.ZstdDecompressor()  # the next frame
    except (zstd.ZstdError, EOFError) as e:
        raise _bad("zstd", str(e) or "corrupt stream") from None
    if not d.eof:
        raise _bad("zstd", "the stream is truncated")
    return out.bytes()


DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip,
    "x-gzip": _gzip,
    "deflate": _deflate,
    "br": _br,
    "zstd": _zstd,
}
