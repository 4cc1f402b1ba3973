"""
What `receipts rules draft --flows` reads of a request: its shape. One shape a write: method,
host, path, query names, content type, status (None: no answer), when it was sent, the names of
its credential and idempotency-key headers, and its body fields by (dotted) name, each with a
token that says whether two values are equal:

- read from a HAR file or a mitmproxy flow file (mitm/flow_file.py), the token is the value
  itself as canonical JSON (an example for the draft's comments), `REDACTED` for a value that is
  token-shaped;
- recorded by the proxy (`--set receipts_learn=PATH`, mitm/learn_file.py), the token is a keyed
  HMAC of the value under a key that lives in the proxy's memory only: equal values have equal
  tokens within one file, and no value can be recovered.

A field whose name looks like a secret never has a token (None), and no header value is kept.
Shapes travel as JSON lines (`shape_line`, `read_shape_lines`); `read_har` reads a HAR file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from proxy_addon.errors import DraftError
from proxy_addon.wire.redaction import REDACTED, is_secret_name, token_shaped

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
IDEMPOTENCY_WORD = "idempot"
MAX_FIELDS = 64  # body fields kept a request: a larger body is cut there (bounded lines, bounded memory)
MAX_DEPTH = 3  # dotted JSON paths go this deep; below, a value is one leaf
LINE_KIND = "receipt-proxy request shape"
NOT_CALLER = frozenset({"proxy-authorization", "cookie", "set-cookie", "mcp-session-id"})


@dataclass(frozen=True)
class RequestShape:
    method: str
    host: str  # host, with :port when not the scheme's default
    path: str  # without the query
    query: tuple[str, ...] = ()
    content_type: str = ""
    status: int | None = None  # None: no answer (the connection failed or was dropped)
    time: float | None = None  # seconds since the epoch, when the request was sent
    fields: dict[str, str | None] = field(default_factory=dict)  # dotted name → value token (None: a secret)
    hashed: bool = False  # tokens are keyed hashes (a learn file): no example values
    credential_headers: tuple[str, ...] = ()  # names only
    key_header: str | None = None  # an Idempotency-Key-like header the request carried


def plain_token(value: Any) -> str:
    """A value as canonical JSON; a token-shaped string as `REDACTED`."""
    if isinstance(value, str) and token_shaped(value):
        return REDACTED
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def hmac_token(key: bytes) -> Callable[[Any], str]:
    """Tokens that say equal values are equal, and nothing else: HMAC-SHA256 under `key`, 16 bytes."""

    def token(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "h:" + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:32]

    return token


def shape_of(
    method: str,
    url: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
    status: int | None,
    time: float | None,
    token: Callable[[Any], str] = plain_token,
) -> RequestShape:
    """The shape of one request (`url` absolute), its body's fields given as `token` makes them."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if ":" in host:  # IPv6
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(parts.scheme)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != default:
        host = f"{host}:{port}"
    query = tuple(dict.fromkeys(name for name, _ in parse_qsl(parts.query, keep_blank_values=True)))
    names = [name for name, _ in headers]
    ctype = next((v for n, v in headers if n.lower() == "content-type"), "")
    credential = tuple(
        dict.fromkeys(
            n
            for n in names
            if (n.lower() == "authorization" or is_secret_name(n))
            and n.lower() not in NOT_CALLER
            and IDEMPOTENCY_WORD not in n.lower()
        )
    )
    key_header = next((n for n in names if IDEMPOTENCY_WORD in n.lower()), None)
    return RequestShape(
        method=method.upper(),
        host=host,
        path=parts.path or "/",
        query=query,
        content_type=ctype.split(";")[0].strip().lower(),
        status=status,
        time=time,
        fields=body_fields(body or b"", ctype, token),
        hashed=token is not plain_token,
        credential_headers=credential,
        key_header=key_header,
    )


def body_fields(body: bytes, content_type: str, token: Callable[[Any], str]) -> dict[str, str | None]:
    """A JSON object's fields by dotted path, or a form's by name; {} for any other body."""
    ctype = content_type.split(";")[0].strip().lower()
    found: dict[str, str | None] = {}
    if not body:
        return found
    if ctype == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            return found
        for name, value in pairs:
            if len(found) >= MAX_FIELDS:
                break
            found.setdefault(name, None if is_secret_name(name) else token(value))
        return found
    if not (ctype == "application/json" or ctype.endswith("+json")):
        return found
    try:
        doc = json.loads(body)
    except ValueError:
        return found
    if isinstance(doc, dict):
        _flatten(doc, "", 1, token, found)
    return found


def _flatten(obj: dict, prefix: str, depth: int, token: Callable[[Any], str], out: dict[str, str | None]) -> None:
    for key, value in obj.items():
        if len(out) >= MAX_FIELDS:
            return
        name = f"{prefix}{key}"
        if is_secret_name(str(key)):
            out[name] = None
        elif isinstance(value, dict) and value and depth < MAX_DEPTH:
            _flatten(value, name + ".", depth + 1, token, out)
        else:
            out[name] = token(value)


# --- as JSON lines -----------------------------------------------------------------------------


def shape_line(shape: RequestShape) -> str:
    """One JSON line (no newline)."""
    doc: dict[str, Any] = {
        "kind": LINE_KIND,
        "method": shape.method,
        "host": shape.host,
        "path": shape.path,
        "query": list(shape.query),
        "content_type": shape.content_type,
        "status": shape.status,
        "time": shape.time,
        "fields": shape.fields,
        "values": "hmac" if shape.hashed else "plain",
    }
    if shape.credential_headers:
        doc["credential_headers"] = list(shape.credential_headers)
    if shape.key_header:
        doc["key_header"] = shape.key_header
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def is_shape_line(text: str) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("kind") == LINE_KIND


def read_shape_lines(lines: Iterable[str], source: str) -> Iterator[RequestShape]:
    """Shapes from JSON lines (a receipts_learn file, mitm/flow_file.py's output); a bad line is a DraftError."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict) or doc.get("kind") != LINE_KIND:
                raise ValueError("not a request shape")
            fields = doc.get("fields") or {}
            if not isinstance(fields, dict) or not all(v is None or isinstance(v, str) for v in fields.values()):
                raise ValueError("`fields` is not a mapping of names to strings")
            status = doc.get("status")
            yield RequestShape(
                method=str(doc["method"]).upper(),
                host=str(doc["host"]).lower(),
                path=str(doc["path"]),
                query=tuple(str(q) for q in doc.get("query") or ()),
                content_type=str(doc.get("content_type") or ""),
                status=int(status) if status is not None else None,
                time=float(doc["time"]) if doc.get("time") is not None else None,
                fields={str(k): v for k, v in fields.items()},
                hashed=doc.get("values") == "hmac",
                credential_headers=tuple(str(h) for h in doc.get("credential_headers") or ()),
                key_header=str(doc["key_header"]) if doc.get("key_header") else None,
            )
        except (ValueError, KeyError, TypeError) as e:
            raise DraftError(f"not a request shape line: {e}", source=source, where=f"line {n}") from None


# --- HAR ---------------------------------------------------------------------------------------


def is_har(text: str) -> bool:
    head = text.lstrip()[:4096]
    return head.startswith("{") and '"log"' in head


def read_har(path: Path) -> list[RequestShape]:
    """The mutating requests of a HAR 1.2 file (browsers' and mitmproxy's export), as shapes."""
    source = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        entries = doc["log"]["entries"]
        if not isinstance(entries, list):
            raise TypeError("log.entries is not a list")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DraftError(f"not a HAR file: {e}", source=source) from None
    shapes = []
    for i, entry in enumerate(entries):
        try:
            req = entry["request"]
            method = str(req["method"]).upper()
            if method not in MUTATING:
                continue
            headers = [(str(h["name"]), str(h.get("value", ""))) for h in req.get("headers") or ()]
            post = req.get("postData") or {}
            body = str(post.get("text") or "").encode("utf-8")
            if post.get("mimeType") and not any(n.lower() == "content-type" for n, _ in headers):
                headers.append(("content-type", str(post["mimeType"])))
            status = int((entry.get("response") or {}).get("status") or 0) or None  # HAR writes 0 for no answer
            shapes.append(shape_of(method, str(req["url"]), headers, body, status, _har_time(entry)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DraftError(f"not a HAR request: {e}", source=source, where=f"log.entries[{i}]") from None
    return shapes


def _har_time(entry: dict) -> float | None:
    started = entry.get("startedDateTime")
    if not isinstance(started, str):
        return None
    try:
        return datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
