"""
Intent fingerprints: what a request means, never what it carries as credentials.

`fingerprint(match, request, key)` builds the sanitized intent (only the fields
the rule allowlists), a principal (an HMAC of the credential, so two accounts
never block each other and no credential is stored), and
`sha256:<hex>` over canonical JSON of both.

Bodies:
- JSON: the allowlisted dotted fields (`article.title`, `items.0.sku`); a missing
  field counts as null.
- form-encoded: the allowlisted field names, taken literally.
- anything else, or no `fingerprint.body` in the rule: the SHA-256 of the whole body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlsplit

from proxy_addon.rules import SECRET_NAME, Match

REDACTED = "REDACTED"
_MISSING = object()


@dataclass(frozen=True)
class RequestView:
    """The parts of an HTTP request a fingerprint may look at."""

    method: str
    scheme: str
    host: str
    port: int
    path: str  # with the query string
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True)
class Intent:
    fingerprint: str
    intent: dict[str, Any]  # the sanitized, allowlisted view that is stored
    principal: str  # short keyed hash of the credential, or "anonymous"
    target: str  # the URL with secret-looking query values redacted


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def redact_url(scheme: str, host: str, port: int, path: str) -> str:
    """The request URL with the value of every secret-looking query parameter replaced."""
    default = {"http": 80, "https": 443}.get(scheme)
    host = f"[{host}]" if ":" in host else host
    netloc = host if port == default else f"{host}:{port}"
    path, _, query = path.partition("?")
    parts = []
    for piece in re.split(r"([&;])", query.partition("#")[0]) if query else ():
        if piece in ("&", ";"):
            parts.append(piece)
            continue
        name, eq, _ = piece.partition("=")
        parts.append(f"{name}={REDACTED}" if eq and SECRET_NAME.search(unquote_plus(name)) else piece)
    return f"{scheme}://{netloc}{path}" + (f"?{''.join(parts)}" if parts else "")


def dig(value: Any, dotted: str) -> Any:
    """The value at a dotted path (`article.title`, `items.0.sku`) in parsed JSON, or None."""
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdecimal() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _body_view(fields: tuple[str, ...] | None, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    if fields == ():
        return {}
    if fields is not None and body:
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "application/x-www-form-urlencoded":
            try:
                form: dict[str, list[str]] = {}
                for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True):
                    form.setdefault(k, []).append(v)
            except (UnicodeDecodeError, ValueError):
                pass
            else:
                return {"form": {f: _one(form.get(f)) for f in fields}}
        else:
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):  # not JSON, or nested too deeply to parse: hashed whole
                pass
            else:
                if isinstance(doc, dict):  # a bare number, string or list has no fields: hashed whole
                    return {"body": {f: dig(doc, f) for f in fields}}
    # Not JSON or form, or the rule names no fields: the whole body identifies the intent.
    return {"body_sha256": hashlib.sha256(body).hexdigest()}


def _one(values: list[str] | None) -> Any:
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def principal_of(match: Match, headers: Mapping[str, str], key: bytes) -> str:
    """A keyed hash of the first credential present: the rule's header, Authorization, then Cookie."""
    for name in (*match.operation.credential_headers, "authorization", "cookie"):
        value = headers.get(name)
        if value:
            return keyed_hash(key, name, value)
    return "anonymous"


def keyed_hash(key: bytes, *parts: str) -> str:
    """An HMAC of `parts`, for identities that must not be stored in the clear (an agent's Idempotency-Key)."""
    return "hmac:" + hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()[:32]


def fingerprint(match: Match, req: RequestView, key: bytes) -> Intent:
    op = match.operation
    spec = op.fingerprint
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(urlsplit(req.path).query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    intent: dict[str, Any] = {"path": {p: match.params[p] for p in spec.path}}
    if spec.query:
        intent["query"] = {q: _one(query.get(q)) for q in spec.query}
    if spec.headers:
        intent["headers"] = {h: req.headers.get(h) for h in spec.headers}
    intent.update(_body_view(spec.body, req.headers, req.body))
    principal = principal_of(match, req.headers, key)
    default_port = {"http": 80, "https": 443}.get(req.scheme)
    bare = req.host.lower().rstrip(".")
    host = bare if req.port == default_port else f"{bare}:{req.port}"
    material = {
        "api": op.api, "operation": op.name, "method": req.method, "host": host,
        "intent": intent, "principal": principal,
    }
    digest = hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()
    return Intent(
        fingerprint=f"sha256:{digest}",
        intent=intent,
        principal=principal,
        target=redact_url(req.scheme, req.host, req.port, req.path),
    )


def load_or_create_key(path: str | Path) -> bytes:
    """The per-installation HMAC key, created on first use with mode 0600."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not p.exists():
        # Write a temporary file, then link it into place: no reader ever sees a partial key.
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            tmp.unlink()
    key = p.read_bytes().strip()
    if len(key) < 32:
        raise ValueError(f"{p}: the HMAC key file is shorter than 32 bytes; delete it to make a new one")
    return key
