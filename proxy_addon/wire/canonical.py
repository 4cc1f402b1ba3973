"""
Canonical request targets: the one spelling of a host and a path that rules match and
fingerprints are taken on, so that equivalent spellings of one request are one intent.

    canonical_host("0x7f000001")               # "127.0.0.1"
    canonical_path("//api/%62/./thing%73?q=1") # "/api/b/things?q=1"
    t = target("http", "127.1", 80, "/api//things")
    t.host, t.path, t.changed                  # "127.0.0.1", "/api/things", True

What is normalised (RFC 3986 §6.2.2, and what servers such as nginx do before routing):
- the host: lower case, no trailing dot; an IPv4 address in any numeric spelling a resolver
  accepts (`127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1`: the WHATWG URL IPv4 parser)
  becomes dotted decimal; an IPv6 literal becomes its compressed form, and an IPv4-mapped
  one (`::ffff:127.0.0.1`) the IPv4 address it maps.
- the path: percent-encodings of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded,
  every other percent-encoding is kept with upper-case hex (`%2F` stays `%2F`, never a
  slash: a reserved character and its encoding are different paths); characters a path may
  not hold (space, non-ASCII, `"<>\\^`{|}`, a stray `%`) are percent-encoded as UTF-8;
  runs of slashes are merged (nginx's `merge_slashes`); `.` and `..` segments are removed
  (RFC 3986 §5.2.4, after decoding, so `%2e%2e` is `..`).
- the query string is kept exactly as sent; case is kept (see `match.case_insensitive`).

What is not normalised, because servers disagree on it (`readings`): a fragment (`#x`: RFC 9110
§4.2.5 says it is never sent; Werkzeug and Express drop it, uvicorn and Go's net/http keep it in
the path) and path parameters (`;jsessionid=1`: Tomcat, Jetty and Spring remove them from every
segment before routing; Werkzeug, Starlette, Express and nginx keep them). RuleSet.match refuses
a request whose readings differ when one of them is a write.

Loopback names (`LOOPBACK`): `localhost`, `127.0.0.1`, `::1`, and the unspecified addresses
`0.0.0.0` and `::` (a connection to them reaches the local host on Linux and macOS) reach the same
sockets; RuleSet takes them as aliases of one another when a rule names one.

Methods: a request's method is the one its method override header names
(`X-HTTP-Method-Override`, `X-HTTP-Method` or `X-Method-Override`, any letter case), as
Rack, Express's method-override and Google APIs take it: `GET` with
`X-HTTP-Method-Override: POST` is a POST (`effective_method`). Headers that name different
methods are a conflict (`ConflictingOverrides`): which one a server takes is a guess.

Only matching, the fingerprint and the record use the canonical form: the request that is
forwarded is the one the agent sent. Nothing here imports mitmproxy.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "LOOPBACK",
    "OVERRIDE_HEADERS",
    "ConflictingOverrides",
    "Target",
    "canonical_encoding",
    "canonical_host",
    "canonical_path",
    "effective_method",
    "ip_literal",
    "method_overrides",
    "param_value",
    "readings",
    "target",
]

UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# What a path may hold unencoded (RFC 3986 pchar and "/"), besides percent-encodings.
_PATH_SAFE = UNRESERVED | frozenset("!$&'()*+,;=:@/")
_HEX = frozenset("0123456789abcdefABCDEF")
_NUMERIC_END = frozenset("0123456789abcdefABCDEFxX.]")  # how an IP literal (or a trailing dot) may end
_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")  # nothing to encode or decode
_DOT_SEGMENT = re.compile(r"(?:^|/)\.\.?(?:/|$)")
_SLASHES = re.compile(r"/{2,}")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_PATH_PARAMS = re.compile(r";[^/]*")  # a segment's ';' and what follows it, as Tomcat removes them

# Hosts, in canonical form, that reach the same sockets: a rule naming one names them all (RuleSet).
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})


def canonical_host(host: str) -> str:
    """A host as rules match it: lower case, no trailing dot, IP literals in one spelling."""
    if host[-1:] not in _NUMERIC_END and ":" not in host:
        return host.lower()  # a name (the common case, on every request): it cannot be an IP literal
    return _literal_host(host)


@functools.lru_cache(maxsize=256)  # matching and the fingerprint ask for the same host on every request
def _literal_host(host: str) -> str:
    """canonical_host of a host that may be an IP literal (it ends like one, or holds a colon)."""
    ip = ip_literal(host)
    if ip is not None:
        return ip
    bare = host.strip().rstrip(".")
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    return bare.rstrip(".").lower()


def ip_literal(host: str) -> str | None:
    """The IP address `host` names, in any spelling (`127.1`, `[::ffff:127.0.0.1]`), canonical; None for a name."""
    bare = host.strip().rstrip(".")
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    bare = bare.rstrip(".")
    return _ipv6(bare) if ":" in bare else _ipv4(bare)


def _ipv6(text: str) -> str | None:
    try:
        address = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped
    return str(mapped) if mapped is not None and address.scope_id is None else address.compressed


def _ipv4(text: str) -> str | None:
    """The WHATWG URL standard's IPv4 parser (what inet_aton accepts): None when `text` is a name."""
    parts = text.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    if not 1 <= len(parts) <= 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    if any(n > 255 for n in values[:-1]) or values[-1] >= 256 ** (5 - len(values)):
        return None
    value = values[-1] + sum(n << (8 * (3 - i)) for i, n in enumerate(values[:-1]))
    return str(ipaddress.IPv4Address(value))


def _ipv4_number(part: str) -> int | None:
    if not part or len(part) > 34:  # longer than any 32-bit number in any base: a name, not an address
        return None
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not digits:
        return 0  # "0x" is zero
    allowed = "0123456789abcdef"[:base]
    if not all(c in allowed for c in digits.lower()):
        return None
    return int(digits, base)


def canonical_encoding(path: str) -> str:
    """Percent-encoded unreserved characters decoded, other encodings upper-cased, what a path may not hold encoded."""
    out: list[str] = []
    i, n = 0, len(path)
    while i < n:
        c = path[i]
        if c == "%" and i + 2 < n and path[i + 1] in _HEX and path[i + 2] in _HEX:
            decoded = chr(int(path[i + 1 : i + 3], 16))
            out.append(decoded if decoded in UNRESERVED else "%" + path[i + 1 : i + 3].upper())
            i += 3
            continue
        if c in _PATH_SAFE:
            out.append(c)
        else:  # a stray '%', a space, a control or non-ASCII character (raw bytes arrive surrogate-escaped)
            out.extend(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape"))
        i += 1
    return "".join(out)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 on an absolute path whose slashes are already merged."""
    segments = path.split("/")[1:]
    out: list[str] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)


def canonical_path(path: str) -> str:
    """
    A request path (with its query string) as rules match it: percent-encodings normalised,
    slashes merged, dot segments removed. The query string is kept as it is.
    """
    raw, sep, query = path.partition("?")
    if raw.startswith("/") and _PLAIN_PATH.fullmatch(raw) and "//" not in raw and not _DOT_SEGMENT.search(raw):
        return path  # already canonical (the common case, on every request to a ruled host)
    if not raw.startswith("/"):
        return path if raw else "/" + sep + query  # "*" (OPTIONS) or an authority: nothing to normalise
    p = canonical_encoding(raw)
    p = _SLASHES.sub("/", p)
    p = _remove_dot_segments(p)
    return p + sep + query


def readings(path: str) -> tuple[str, ...]:
    """
    The request targets (path and query) a server could take `path` for, as sent first: also
    without its fragment (`#...`), and without its path parameters (`;...` up to the next `/`,
    removed before percent-decoding and dot segments, as Tomcat does: `/a/..;/b` is `/b` there).
    One reading, the path itself, when it has no '#' and no ';' before its query.
    """
    if "#" not in path and ";" not in path.partition("?")[0]:
        return (path,)
    found = [path]
    if "#" in path:
        found.append(path.partition("#")[0])
    for p in list(found):
        end = min((i for i in (p.find("?"), p.find("#")) if i >= 0), default=len(p))
        if ";" in p[:end]:
            found.append(_PATH_PARAMS.sub("", p[:end]) + p[end:])
    return tuple(dict.fromkeys(found))


def param_value(segment: str) -> str:
    """
    A path parameter as its text, for the fingerprint: `%745` and `t5`, `caf%C3%A9` and `café`,
    `a%2Fb` and `a/b` are one value. A literal '%' stays `%25` and bytes that are not UTF-8 stay
    `%XX`, so two different byte strings never give the same text. Expects a canonical segment.
    """
    if "%" not in segment:
        return segment
    data = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == "%" and i + 2 < len(segment) and all(c in _HEX for c in segment[i + 1 : i + 3]):
            data.append(int(segment[i + 1 : i + 3], 16))
            i += 3
        else:
            data += segment[i].encode("utf-8", "surrogateescape")
            i += 1
    text = bytes(data).decode("utf-8", "surrogateescape")
    return "".join(
        "%25" if ch == "%" else f"%{ord(ch) - 0xDC00:02X}" if 0xDC80 <= ord(ch) <= 0xDCFF else ch for ch in text
    )


@dataclass(frozen=True)
class Target:
    """A request's target as sent (`raw_host`, `raw_path`) and in its canonical form (`host`, `path`)."""

    scheme: str
    host: str
    port: int
    path: str  # canonical, with the query string as sent
    raw_host: str
    raw_path: str

    @property
    def changed(self) -> bool:
        """Whether the request was sent in another spelling than the canonical one."""
        return (self.host, self.path) != (self.raw_host, self.raw_path)

    @property
    def authority(self) -> str:
        """`host` or `host:port` (IPv6 in brackets), the port left out when it is the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS.get(self.scheme) else f"{host}:{self.port}"


def target(scheme: str, host: str, port: int, path: str) -> Target:
    """The canonical form of a request's target, with the raw one kept."""
    return Target(scheme, canonical_host(host), port, canonical_path(path), host, path)


# --- methods -------------------------------------------------------------------------------------

# The headers that name a request's method in place of its request line's (Rack and Express's
# method-override read the first, Microsoft's and some Java frameworks the second, others the third).
OVERRIDE_HEADERS = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")
_OVERRIDE_NAMES: dict[str | bytes, str] = {
    **{h.lower(): h for h in OVERRIDE_HEADERS},
    **{h.lower().encode(): h for h in OVERRIDE_HEADERS},
}
_METHOD_TOKEN = re.compile(r"[A-Z0-9!#$%&'*+.^_`|~-]{1,24}")  # an RFC 9110 token, as a method name


class ConflictingOverrides(ValueError):
    """A request's method override headers name different methods: which one a server takes is a guess."""


def method_overrides(headers: Iterable[tuple[str | bytes, str | bytes]]) -> list[tuple[str, str]]:
    """
    What a request's method override headers say, as (header, method) in the order sent: the
    header as `OVERRIDE_HEADERS` spells it, the method in upper case. A repeated header and a
    comma-separated value give one pair per value; empty values are left out. A value that is
    not a method name is given as `?` (it names no method any rule has, and is never stored).
    `headers`: (name, value) pairs, str or bytes, every occurrence (mitmproxy's `headers.fields`).
    """
    found: list[tuple[str, str]] = []
    for name, value in headers:
        header = _OVERRIDE_NAMES.get(name.lower())  # bytes or str: the names are in both forms
        if header is None:
            continue
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        for part in value.split(","):
            method = part.strip().upper()
            if method:
                found.append((header, method if _METHOD_TOKEN.fullmatch(method) else "?"))
    return found


def effective_method(method: str, headers: Iterable[tuple[str | bytes, str | bytes]]) -> str:
    """
    The method a request means: the one its override headers name (upper case), else `method`
    as sent. Raises ConflictingOverrides, naming the headers, when they name different methods.
    """
    found = method_overrides(headers)
    named = {m for _, m in found}
    if len(named) > 1:
        raise ConflictingOverrides(
            "the method override headers name different methods: " + ", ".join(f"{h}: {m}" for h, m in found)
        )
    return named.pop() if named else method
