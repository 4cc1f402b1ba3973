"""
Header fields a matched write cannot be sent with, found before any receipt is written.

    bad = bad_field(request.headers.fields)   # None, or (the header's name as shown, what is wrong)

Why: mitmproxy passes a client's header through to the hooks in forms no HTTP client can
send. It keeps an obs-fold line (a value continued on the next line, RFC 9112 §5.2) as
`first\\r\\n second` in the value, and keeps a bare CR or a NUL; with
`validate_inbound_headers` off it keeps a name that is not a token too. Our exchange's
HTTP client (h11, under httpx) then refuses to build the request head. The proxy answers
such a request 400 itself instead, naming the header, before the receipt is committed: it
is not an attempt (nothing can be sent), so it has no receipt.

What is refused (the first bad field, in order):
- a name that is not an RFC 9110 §5.1 token;
- a value holding a CR, a LF or a NUL (RFC 9110 §5.5: "invalid and dangerous"; a recipient
  MUST reject them or replace them with SP), said as obs-fold when a line break is followed
  by a space or a tab;
- a value holding a VT or FF, or beginning or ending with a space or a tab: RFC 9110's
  field-value has neither, and h11 refuses to send them. (mitmproxy strips the ends of an
  HTTP/1 value, so these come only over HTTP/2.)

Other control characters (RFC 9110: "recipients MAY retain such characters") pass, as they
pass h11. The value itself is never quoted anywhere: it may be a credential.

    name = undecodable(request.headers.fields, ("x-title", "authorization"))  # None, or the name as shown

Headers the proxy reads as text (a header the fingerprint names, a credential, the idempotency
key: fingerprint.text_headers) must be UTF-8: a Latin-1 byte or an encoded surrogate is read as
one character by one server and another by the next (RFC 9110 §5.5 calls such octets opaque),
and would not enter the fingerprint as any text. Such a write is refused (400) as bad input,
before any receipt; every other header is forwarded untouched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["bad_field", "undecodable"]

TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
SHOWN_NAME = 64  # characters of a name shown in an answer or a log line
OBS_FOLD = re.compile(rb"\r?\n[ \t]")
SUSPECT = re.compile(rb"[\r\n\0\x0b\x0c]|\A[ \t]|[ \t]\Z")  # any of what value_problem looks for: one search


def bad_field(fields: Iterable[tuple[bytes, bytes]]) -> tuple[str, str] | None:
    """The first header field that cannot be sent: (its name as shown, what is wrong with it), else None."""
    for name, value in fields:
        if not TOKEN.fullmatch(name):
            return shown(name), "has a name that is not an HTTP token (RFC 9110 §5.1)"
        problem = value_problem(value)
        if problem:
            return shown(name), problem
    return None


def value_problem(value: bytes) -> str | None:
    """What makes a field value unsendable, or None. Says where, never what the value is."""
    if not SUSPECT.search(value):
        return None  # every field of nearly every request
    if OBS_FOLD.search(value):
        return "is folded over several lines (obs-fold, RFC 9112 §5.2)"
    for char, what in ((b"\r", "a CR"), (b"\n", "a LF"), (b"\0", "a NUL")):
        if char in value:
            return f"holds {what} (RFC 9110 §5.5)"
    if b"\x0b" in value or b"\x0c" in value:
        return "holds a VT or FF control character (RFC 9110 §5.5)"
    if value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
        return "begins or ends with whitespace (RFC 9110 §5.5)"
    return None


def shown(name: bytes) -> str:
    """A header name for an answer or a log: printable ASCII as is, other bytes escaped, at most SHOWN_NAME long."""
    text = "".join(chr(b) if 0x20 < b < 0x7F else f"\\x{b:02x}" for b in name)
    return text if len(text) <= SHOWN_NAME else text[:SHOWN_NAME] + "…"


def undecodable(fields: Iterable[tuple[bytes, bytes]], names: Iterable[str]) -> str | None:
    """The first field named in `names` (lower case) whose value is not UTF-8, its name as shown; else None."""
    wanted = {n.encode("ascii", "replace") for n in names}
    for name, value in fields:
        if value.isascii() or name.lower() not in wanted:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return shown(name)
    return None
