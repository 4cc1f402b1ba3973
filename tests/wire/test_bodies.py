"""
Unit tests for proxy_addon.wire.bodies: each content coding, stacked codings, bombs stopped at the limit,
bad streams. The RSS of a process decoding a bomb: tests/e2e/wire/test_bodies.py.
"""

from __future__ import annotations

import gzip
import json
import sys
import tracemalloc
import zlib
from typing import Protocol

import brotli
import pytest

from proxy_addon.errors import BadEncoding, BodyTooLarge, ReceiptsError, UnsupportedEncoding
from proxy_addon.wire import bodies
from proxy_addon.wire.bodies import decode_body

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd


DOC = json.dumps({"title": "café ☕", "items": [{"sku": f"A{i}", "qty": i} for i in range(3000)]}).encode()


LIMIT = 10 * 1024 * 1024


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS = {
    "gzip": gzip.compress,
    "gzip -1": lambda d: gzip.compress(d, compresslevel=1, mtime=0),
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "deflate (raw)": raw_deflate,
    "br": brotli.compress,
    "zstd": zstd.compress,
}


@pytest.mark.parametrize("name", list(ENCODERS))
def test_each_coding_decodes_to_the_plain_body(name):
    coding = name.split()[0]
    encoded = ENCODERS[name](DOC)
    assert encoded != DOC
    assert decode_body(encoded, coding, limit=LIMIT) == DOC


@pytest.mark.parametrize("header", [None, "", "identity", " Identity ", "identity, identity"])
def test_no_coding_returns_the_body_as_it_is(header):
    assert decode_body(DOC, header, limit=LIMIT) is DOC


@pytest.mark.parametrize(
    "header, encode",
    [
        ("gzip, br", lambda d: brotli.compress(gzip.compress(d))),
        ("br, gzip", lambda d: gzip.compress(brotli.compress(d))),
        ("deflate, zstd", lambda d: zstd.compress(zlib.compress(d))),
        ("GZIP ,identity,  zstd", lambda d: zstd.compress(gzip.compress(d))),
        ("gzip, gzip", lambda d: gzip.compress(gzip.compress(d))),
    ],
)
def test_stacked_codings_are_undone_last_applied_first(header, encode):
    assert decode_body(encode(DOC), header, limit=LIMIT) == DOC


def test_several_gzip_members_and_zstd_frames_are_one_body():
    assert decode_body(gzip.compress(DOC[:100]) + gzip.compress(DOC[100:]), "gzip", limit=LIMIT) == DOC
    assert decode_body(gzip.compress(DOC) + b"\0" * 16, "gzip", limit=LIMIT) == DOC  # padding, as gzip(1) allows
    assert decode_body(zstd.compress(DOC[:100]) + zstd.compress(DOC[100:]), "zstd", limit=LIMIT) == DOC


def test_an_empty_body_is_empty_whatever_the_coding():
    assert decode_body(b"", "gzip, br", limit=LIMIT) == b""


def test_a_body_of_exactly_the_limit_passes_and_one_byte_more_does_not():
    assert decode_body(gzip.compress(DOC), "gzip", limit=len(DOC)) == DOC
    with pytest.raises(BodyTooLarge) as e:
        decode_body(gzip.compress(DOC), "gzip", limit=len(DOC) - 1)
    assert e.value.limit == len(DOC) - 1
    assert "receipts_body_cap" in str(e.value)
    with pytest.raises(BodyTooLarge):
        decode_body(DOC, None, limit=len(DOC) - 1)  # no coding: the body itself is past the bound


ZEROS = 64 * 1024 * 1024  # a 64 MiB bomb, decoded with a 1 MiB limit


class Compressor(Protocol):
    """What zlib's and zstd's streaming compressors share."""

    def compress(self, data: bytes, /) -> bytes: ...

    def flush(self) -> bytes: ...


def bomb(coding: str) -> bytes:
    chunk = b"\0" * (1024 * 1024)
    c: Compressor
    if coding == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    elif coding == "deflate":
        c = zlib.compressobj(9)
    elif coding == "br":
        br = brotli.Compressor(quality=1)  # process and finish, not compress and flush
        return b"".join(br.process(chunk) for _ in range(ZEROS // len(chunk))) + br.finish()
    else:
        c = zstd.ZstdCompressor()
    return b"".join(c.compress(chunk) for _ in range(ZEROS // len(chunk))) + c.flush()


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_a_bomb_stops_at_the_limit_without_allocating_past_it(coding):
    data = bomb(coding)
    assert len(data) < ZEROS // 100
    limit = 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge) as e:
            decode_body(data, coding, limit=limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.limit == limit and e.value.encoding == coding
    # The output gathered is at most limit + one chunk (bytearray growth aside): far from the 64 MiB inside.
    assert peak < limit + 4 * bodies.CHUNK + 512 * 1024, f"{coding}: peak {peak} bytes"


@pytest.mark.parametrize(
    "coding, data",
    [
        ("gzip", gzip.compress(DOC)[:-12]),  # truncated
        ("gzip", b"not gzip at all"),
        ("gzip", gzip.compress(DOC) + b"trailing"),
        ("deflate", zlib.compress(DOC)[:-40]),
        ("deflate", b"\xff\xfe not deflate"),
        ("deflate", zlib.compress(DOC) + b"x"),
        ("br", brotli.compress(DOC)[:-3]),
        ("br", b"not brotli!"),
        ("br", brotli.compress(DOC) + b"x"),
        ("zstd", zstd.compress(DOC)[:-5]),
        ("zstd", b"not zstd"),
        ("zstd", zstd.compress(DOC) + b"x"),
        ("gzip, br", gzip.compress(DOC)),  # the header says br was applied last: it was not
    ],
)
def test_a_corrupt_or_truncated_stream_is_a_bad_encoding(coding, data):
    with pytest.raises(BadEncoding) as e:
        decode_body(data, coding, limit=LIMIT)
    assert not isinstance(e.value, UnsupportedEncoding)
    assert isinstance(e.value, ReceiptsError)
    assert "nothing was sent" in str(e.value)


@pytest.mark.parametrize("header, named", [("compress", "compress"), ("gzip, lzma", "lzma"), ("gz", "gz")])
def test_an_unknown_coding_is_named(header, named):
    with pytest.raises(UnsupportedEncoding) as e:
        decode_body(b"anything", header, limit=LIMIT)
    assert e.value.encoding == named
    assert repr(named) in str(e.value) and "gzip" in str(e.value)  # names it, and what the proxy knows


def test_too_many_stacked_codings_are_refused():
    data = DOC
    for _ in range(bodies.MAX_CODINGS + 1):
        data = gzip.compress(data)
    with pytest.raises(BadEncoding, match="stacks"):
        decode_body(data, ", ".join(["gzip"] * (bodies.MAX_CODINGS + 1)), limit=LIMIT)
    assert decode_body(data, ", ".join(["gzip"] * bodies.MAX_CODINGS), limit=LIMIT) != DOC  # 4 of 5 undone
