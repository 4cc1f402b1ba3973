"""
The same write, however it is spelled, is one fingerprint; different writes are different ones.

A property over random JSON intents, driven through the functions the proxy runs on every
matched request, in its order (mitm/receipts_addon.py): `RuleSet.match` on the host and path as sent
(requestheaders), the body's Content-Encoding undone (`bodies.decode_body`, as
`Receipts._body` does), the request view of a real mitmproxy `Request` (`flows.request_view`)
and `fingerprint`. Each intent is sent as random equivalent requests:

- targets: percent-encoded unreserved characters (either hex case), other encodings in
  either hex case, `.` and `x/..` segments (also percent-encoded), runs of slashes, the
  host in any letter case with or without a trailing dot, and numeric aliases of an IP
  host (1 to 4 parts, each decimal, octal or hex, or IPv4-mapped IPv6);
- bodies: key order, whitespace, the title in NFC or NFD, identity, gzip or deflate
  (zlib or raw) at any level;
- methods: `POST`, or another method with a method override header naming POST
  (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`, the method in any letter case).

Through a real proxy: tests/e2e/proxy/test_canonical_requests.py (targets), tests/e2e/proxy/test_method_override.py
(methods).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import string
import unicodedata
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mitmproxy import http

from proxy_addon.intent.fingerprint import fingerprint
from proxy_addon.mitm.flows import request_view
from proxy_addon.rules import RuleSet, load_rules
from proxy_addon.wire.bodies import codings, decode_body
from proxy_addon.wire.canonical import param_value

KEY = b"same-write-key-0123456789abcdef0123"
CAP = 1 << 20  # receipts_body_cap for the decoder, as the proxy passes it
RULES = RuleSet.of(
    [
        load_rules(
            """\
api: same
hosts: [api.test, "127.0.0.1:8080"]
credentials: {header: api-key}
operations:
  things.create:
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title, n], query: [q]}
""",
            "same.yaml",
        )
    ]
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

UNRESERVED = string.ascii_letters + string.digits + "-._~"
SUB_DELIMS = "!$&'()*+,;=:@"  # literal in a path; their encodings are other paths, so a spelling never encodes them


# --- intents -----------------------------------------------------------------------------------

# A path parameter as atoms: a character written as itself, or a byte that must stay encoded.
# A raw ';' starts path parameters, which servers read differently: the proxy refuses them
# (tests/rules/test_ruleset.py); as data it is sent encoded, %3B.
atom = st.one_of(
    st.sampled_from([c for c in UNRESERVED + SUB_DELIMS if c != ";"]),
    st.sampled_from(["%2F", "%3F", "%23", "%25", "%20", "%3B", "%C3%A9", "%E2%82%AC", "%FF"]),
)


@dataclass(frozen=True)
class Intent:
    host: str  # "api.test" or "127.0.0.1"
    bucket: tuple[str, ...]  # atoms
    title: str
    n: int
    q: str

    @property
    def port(self) -> int:
        return 443 if self.host == "api.test" else 8080

    @property
    def scheme(self) -> str:
        return "https" if self.host == "api.test" else "http"

    def key(self) -> tuple:
        """What makes two intents the same write: the decoded parameter, the NFC title, n, q, the host."""
        return (self.host, param_value("".join(self.bucket)), unicodedata.normalize("NFC", self.title), self.n, self.q)


intents = st.builds(
    Intent,
    host=st.sampled_from(["api.test", "127.0.0.1"]),
    bucket=st.lists(atom, min_size=1, max_size=8).map(tuple).filter(lambda b: "".join(b) not in (".", "..")),
    title=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    n=st.integers(-(2**40), 2**40),
    q=st.text(string.ascii_letters + string.digits + "-_", max_size=6),
)


# --- spellings of a target ---------------------------------------------------------------------


def _hex(draw, byte: int) -> str:
    text = f"%{byte:02X}"
    return text.lower() if draw(st.booleans()) else text


def spell_atom(draw, a: str) -> str:
    if a.startswith("%"):  # stays encoded; either hex case
        return a.lower() if draw(st.booleans()) else a
    if a in UNRESERVED and draw(st.booleans()):
        return _hex(draw, ord(a))
    return a


def spell_segment(draw, text_atoms) -> str:
    return "".join(spell_atom(draw, a) for a in text_atoms)


@st.composite
def spelled_path(draw, bucket: tuple[str, ...], q: str) -> str:
    segments = [tuple("api"), bucket, tuple("things")]
    out = ""
    for seg in segments:
        for _ in range(draw(st.integers(0, 2))):  # detours: "." or "x/.." (each maybe encoded)
            if draw(st.booleans()):
                out += "/" * draw(st.integers(1, 3)) + draw(st.sampled_from([".", "%2E", "%2e"]))
            else:
                out += "/" + draw(st.sampled_from(["x", "zz", "%7A"]))
                out += "/" * draw(st.integers(1, 2)) + draw(st.sampled_from(["..", "%2E%2E", ".%2e"]))
        out += "/" * draw(st.integers(1, 3)) + spell_segment(draw, seg)
    return out + f"?q={q}"


@st.composite
def spelled_ipv4(draw, ip: str) -> str:
    value = int.from_bytes(bytes(int(b) for b in ip.split(".")), "big")
    octets = [(value >> s) & 0xFF for s in (24, 16, 8, 0)]
    if draw(st.integers(0, 4)) == 0:  # IPv4-mapped IPv6
        form = draw(
            st.sampled_from(
                [
                    f"::ffff:{ip}",
                    f"::ffff:{value >> 16:x}:{value & 0xFFFF:x}",
                    f"0:0:0:0:0:ffff:{value >> 16:04x}:{value & 0xFFFF:04x}",
                ]
            )
        )
        form = form.upper() if draw(st.booleans()) else form
        return f"[{form}]" if draw(st.booleans()) else form
    parts = draw(st.integers(1, 4))
    numbers = {1: [value], 2: [octets[0], value & 0xFFFFFF], 3: [octets[0], octets[1], value & 0xFFFF], 4: octets}[
        parts
    ]

    def number(n: int) -> str:
        base = draw(st.sampled_from(["dec", "oct", "hex"]))
        if base == "dec":
            return str(n)
        if base == "oct":
            return "0" * draw(st.integers(1, 3)) + (f"{n:o}" if n else "")
        digits = f"{n:x}"
        digits = digits.upper() if draw(st.booleans()) else digits
        return draw(st.sampled_from(["0x", "0X"])) + "0" * draw(st.integers(0, 2)) + digits

    text = ".".join(number(n) for n in numbers)
    return text + "." if draw(st.booleans()) else text


@st.composite
def spelled_host(draw, host: str) -> str:
    if host == "127.0.0.1":
        return draw(spelled_ipv4(host))
    text = "".join(c.upper() if draw(st.booleans()) else c for c in host)
    return text + "." if draw(st.booleans()) else text


# --- spellings of a body -------------------------------------------------------------------------


@st.composite
def spelled_body(draw, intent: Intent) -> tuple[bytes, str | None]:
    form = draw(st.sampled_from(["NFC", "NFD"]))
    doc = {"title": unicodedata.normalize(form, intent.title), "n": intent.n, "note": draw(st.text(max_size=5))}
    keys = list(doc)
    random.Random(draw(st.integers(0, 1000))).shuffle(keys)
    indent = draw(st.sampled_from([None, 0, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    text = json.dumps({k: doc[k] for k in keys}, indent=indent, separators=separators, ensure_ascii=draw(st.booleans()))
    raw = (draw(st.sampled_from(["", " ", "\n", "\t "])) + text + draw(st.sampled_from(["", "\n", " \r\n"]))).encode()
    coding = draw(st.sampled_from([None, "gzip", "deflate", "deflate-raw"]))
    level = draw(st.integers(0, 9))
    if coding == "gzip":
        return gzip.compress(raw, compresslevel=level, mtime=draw(st.integers(0, 2**31))), "gzip"
    if coding == "deflate":
        return zlib.compress(raw, level), "deflate"
    if coding == "deflate-raw":  # what some clients send as deflate: no zlib header
        c = zlib.compressobj(level, zlib.DEFLATED, -15)
        return c.compress(raw) + c.flush(), "deflate"
    return raw, None


@st.composite
def spelled_method(draw) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """POST, or another method with an override header naming POST (in any letter case)."""
    method = draw(st.sampled_from(["POST", "GET", "PUT", "PATCH", "DELETE"]))
    if method == "POST" and draw(st.booleans()):
        return b"POST", []
    header = draw(st.sampled_from(["X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"]))
    header = draw(st.sampled_from([header, header.lower(), header.upper()]))
    value = "".join(c.lower() if draw(st.booleans()) else c for c in "POST")
    return method.encode(), [(header.encode(), value.encode())]


@st.composite
def spelled(draw, intent: Intent) -> http.Request:
    """One request for `intent`, as an agent might send it."""
    host = draw(spelled_host(intent.host))
    path = draw(spelled_path(intent.bucket, intent.q))
    body, coding = draw(spelled_body(intent))
    method, override = draw(spelled_method())
    headers = [
        (b"Host", f"{host}:{intent.port}".encode()),
        (b"Content-Type", b"application/json"),
        (b"api-key", b"the-same-key"),
        *override,
    ]
    if coding:
        headers.append((b"Content-Encoding", coding.encode()))
    return http.Request(
        host,
        intent.port,
        method,
        intent.scheme.encode(),
        b"",
        path.encode(),
        b"HTTP/1.1",
        http.Headers(headers),
        body,
        None,
        0,
        0,
    )


def proxy_fingerprint(req: http.Request) -> str:
    """What the proxy does with a request, in its order (mitm/receipts_addon.py requestheaders, _body, _begin)."""
    m = RULES.match(req.host, req.port, req.method, req.path, headers=req.headers.fields)
    assert m is not None, f"{req.method} {req.host} {req.path} slipped past the rules"
    assert m.operation.name == "things.create" and m.refused is None
    coding = req.headers.get("content-encoding")
    raw = req.raw_content or b""
    body = decode_body(raw, coding, limit=CAP) if codings(coding) else raw
    # request_view(req, body) once the proxy passes the decoded body to it; the same view either way.
    view = dataclasses.replace(request_view(req), body=body)
    return fingerprint(m, view, KEY).fingerprint


# --- the properties ------------------------------------------------------------------------------


@SETTINGS
@given(st.data(), intents)
def test_equivalent_requests_are_one_fingerprint(data, intent):
    a = data.draw(spelled(intent), label="a")
    b = data.draw(spelled(intent), label="b")
    assert proxy_fingerprint(a) == proxy_fingerprint(b)


@SETTINGS
@given(st.data(), intents, intents)
def test_different_intents_are_different_fingerprints(data, one, other):
    assume(one.key() != other.key())
    a = data.draw(spelled(one), label="a")
    b = data.draw(spelled(other), label="b")
    assert proxy_fingerprint(a) != proxy_fingerprint(b)


@SETTINGS
@given(st.data(), intents)
def test_a_change_of_one_field_is_another_write(data, intent):
    """The nearest different intents: one field changed, everything else spelled at random."""
    field = data.draw(st.sampled_from(["bucket", "title", "n", "q", "host"]))
    if field == "bucket":
        other = dataclasses.replace(intent, bucket=(*intent.bucket, "%2F"))
    elif field == "title":
        other = dataclasses.replace(intent, title=intent.title + "x")
    elif field == "n":
        other = dataclasses.replace(intent, n=intent.n + 1)
    elif field == "q":
        other = dataclasses.replace(intent, q=intent.q + "x")
    else:
        other = dataclasses.replace(intent, host="127.0.0.1" if intent.host == "api.test" else "api.test")
    assert proxy_fingerprint(data.draw(spelled(intent))) != proxy_fingerprint(data.draw(spelled(other)))
