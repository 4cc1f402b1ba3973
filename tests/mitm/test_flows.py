"""proxy_addon.mitm.flows: a message's headers as the core reads them, and the proxy's own answers as responses."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.test import tutils

from proxy_addon.mitm.flows import headers_of, response_of
from proxy_addon.outcome.http_answers import Answer


@pytest.mark.parametrize(
    "fields, expected",
    [
        ([], {}),
        ([(b"Content-Type", b"application/json")], {"content-type": "application/json"}),
        # a repeated name, in any letter case: one entry, its values joined as mitmproxy's headers[name] joins them
        ([(b"Accept", b"a"), (b"X-K", b"1"), (b"accept", b"b")], {"accept": "a, b", "x-k": "1"}),
        ([(b"Set-Cookie", b"c1"), (b"SET-COOKIE", b"c2"), (b"set-cookie", b"")], {"set-cookie": "c1, c2, "}),
        # bytes that are not UTF-8 arrive surrogate-escaped, as mitmproxy gives them
        ([(b"X-Raw", b"\xff\xfe")], {"x-raw": "\udcff\udcfe"}),
        # names lower-cased as text: two names that differ beyond ASCII case stay two names, the last one wins
        ([(b"X-\xc3\x84", b"1"), (b"x-\xc3\xa4", b"2")], {"x-ä": "2"}),
    ],
)
def test_headers_of_reads_every_field_as_mitmproxy_folds_them(fields, expected):
    req = tutils.treq()
    req.headers = http.Headers(fields)
    got = headers_of(req)
    assert got == expected
    assert got == {k.lower(): v for k, v in req.headers.items()}  # what it replaces: one lookup per name


@pytest.mark.parametrize(
    "answer",
    [
        Answer(409, (("Content-Type", "application/json"), ("content-length", "3")), b"{}\n"),
        Answer(201, (("X-A", "1"), ("x-a", "2"), ("X-\udcff", "\udcfe")), b"x" * 10),
        Answer(599, (), b""),  # a status with no reason phrase
        Answer(200, (("Transfer-Encoding", "chunked"),), b"abc"),  # framing as built, never recomputed
    ],
)
def test_response_of_is_the_answer_as_built(answer):
    resp = response_of(answer)
    made = http.Response.make(answer.status)  # what it was built from before: make, then headers and body replaced
    made.headers = http.Headers(
        [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in answer.headers]
    )
    made.raw_content = answer.body
    assert (resp.http_version, resp.status_code, resp.reason) == (made.http_version, made.status_code, made.reason)
    assert resp.headers.fields == made.headers.fields
    assert resp.raw_content == answer.body and resp.trailers is None
    assert resp.timestamp_start is not None and resp.timestamp_end is not None
